import jax
import numpy as np
import pytest

from learner.config import ModelConfig
from learner.hf_config import checkpoint_fields
from learner.model import init_params
from learner.shapes import SHAPES, Shape


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_parameter_count_is_the_models(name):
    shape = SHAPES[name]
    abstract = jax.eval_shape(lambda: init_params(ModelConfig(**shape.model_fields()), 0))
    assert shape.parameters() == sum(np.prod(x.shape) for x in jax.tree.leaves(abstract))


def test_qwen2_500m_is_qwen2_5_0_5b():
    shape = SHAPES["qwen2-500m"]
    assert (shape.d_model, shape.n_layers, shape.n_heads, shape.n_kv_heads, shape.d_ff, shape.vocab) == (
        896, 24, 14, 2, 4864, 151_936)
    assert shape.qkv_bias and shape.tie_embeddings and round(shape.parameters() / 1e6) == 494


def test_qwen2_1_5b_is_qwen2_5_1_5b():
    shape = SHAPES["qwen2-1.5b"]
    assert (shape.d_model, shape.n_layers, shape.n_heads, shape.n_kv_heads, shape.d_ff, shape.vocab) == (
        1536, 28, 12, 2, 8960, 151_936)
    assert (shape.rope_theta, shape.norm_eps) == (1e6, 1e-6)
    assert shape.qkv_bias and shape.tie_embeddings and shape.parameters() == 1_543_714_304


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_the_hf_config_reads_back_as_the_shape(tmp_path, family):
    import json

    shape = Shape(family, 64, 2, 4, 2, 128, 300, tie_embeddings=family == "qwen2")
    (tmp_path / "config.json").write_text(json.dumps(shape.hf_config(max_len=256, eos_token_id=2, bos_token_id=None)))
    fields = checkpoint_fields(str(tmp_path), {})
    assert {k: fields[k] for k in shape.model_fields()} == shape.model_fields()
