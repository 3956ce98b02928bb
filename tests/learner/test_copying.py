import numpy as np

from learner.config import ModelConfig
from learner.copying import LENGTH, copied_share, copy_pretrain, copy_sample
from learner.model import init_params
from learner.trajectory import OBSERVATION

MODEL = ModelConfig(d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=128, vocab=32, max_len=256)


def test_a_copy_sample_is_a_span_shown_twice_and_trains_on_the_second_showing_only():
    span = np.arange(5, 5 + LENGTH)
    sample = copy_sample(span, bos=1)
    assert sample.tokens.tolist() == [1, *span.tolist(), *span.tolist()]
    assert sample.versions.tolist() == [OBSERVATION] * (1 + LENGTH) + [0] * LENGTH


def test_copy_pretraining_teaches_a_small_model_to_copy_from_its_context():
    ids = np.arange(3, 32)
    params = init_params(MODEL, 0)
    before = copied_share(params, MODEL, ids=ids, bos=1)
    logs = []
    trained, result = copy_pretrain(params, MODEL, ids=ids, bos=1, steps=150, log=logs.append)
    assert jax_tree_shapes(trained) == jax_tree_shapes(params)
    assert logs[-1].startswith("copy pretraining update 150/150: nll")
    # Chance is 1 in 29; the phase change comes within 150 updates at this size.
    assert before < 0.1 and result["copied"] > 0.9, (before, result)
    assert result["copied"] == copied_share(trained, MODEL, ids=ids, bos=1)


def jax_tree_shapes(params) -> dict:
    import jax

    return jax.tree.map(lambda x: np.shape(x), params)
