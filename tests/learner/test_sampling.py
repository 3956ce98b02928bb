import jax
import jax.numpy as jnp
import numpy as np
import pytest

from learner.config import ModelConfig
from learner.model import forward_fn, init_params
from learner.sampling import Sampler, SamplingParams, decode, prefill, sampling_logprobs

CONFIG = ModelConfig(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, max_len=48)
CONTEXTS = [[1, 5, 6, 7], [1, 8, 9], [1, 10, 11, 12, 13, 14, 15]]


@pytest.fixture(scope="module")
def params():
    return init_params(CONFIG, seed=0), init_params(CONFIG, seed=1)


def _recomputed_logprobs(params, context, new_tokens, sampling, first=0):
    """Log-probs of new_tokens[first:] by a full no-cache forward pass over the sequence."""
    sequence = np.array(context + list(new_tokens))[None]
    length = sequence.shape[1]
    logits = jax.jit(forward_fn(CONFIG))(params, sequence, np.arange(length)[None], np.ones((1, length), np.int32))
    logp = sampling_logprobs(logits[0], sampling)
    return np.array([logp[len(context) - 1 + i, t] for i, t in enumerate(new_tokens)])[first:]


def test_sampling_logprobs_filter_top_k_and_top_p_by_hand():
    logits = jnp.log(jnp.array([[0.1, 0.2, 0.3, 0.4]]))
    np.testing.assert_allclose(
        jnp.exp(sampling_logprobs(logits, SamplingParams(top_k=2))), [[0, 0, 3 / 7, 4 / 7]], atol=1e-6)
    # 0.4 + 0.3 reaches 0.6, so the nucleus is {3, 2}; at 0.75 it also needs 0.2.
    np.testing.assert_allclose(
        jnp.exp(sampling_logprobs(logits, SamplingParams(top_p=0.6))), [[0, 0, 3 / 7, 4 / 7]], atol=1e-6)
    np.testing.assert_allclose(
        jnp.exp(sampling_logprobs(logits, SamplingParams(top_p=0.75))), [[0, 2 / 9, 3 / 9, 4 / 9]], atol=1e-6)
    hot = jnp.exp(sampling_logprobs(logits, SamplingParams(temperature=0.5)))
    np.testing.assert_allclose(hot, [np.array([1, 4, 9, 16]) / 30], atol=1e-6)


@pytest.mark.parametrize("bad", [dict(temperature=0.0), dict(top_k=-1), dict(top_p=0.0), dict(top_p=1.5)])
def test_sampling_params_are_validated(bad):
    with pytest.raises(ValueError):
        SamplingParams(**bad)


@pytest.mark.parametrize("options", [dict(temperature=1.0), dict(temperature=0.7, top_k=20, top_p=0.9)])
def test_cached_logprobs_equal_a_full_recompute(params, options):
    generation = Sampler(CONFIG, stop_ids=()).generate(
        params[0], CONTEXTS, max_new_tokens=20, key=jax.random.key(0), **options)
    sampling = SamplingParams(**options)
    for context, tokens, logprobs in zip(CONTEXTS, generation.tokens, generation.logprobs):
        assert len(tokens) == 20 and np.all(np.isfinite(logprobs))
        np.testing.assert_allclose(logprobs, _recomputed_logprobs(params[0], context, tokens, sampling), atol=1e-5)


def test_rows_stop_at_a_stop_token_or_a_full_window(params):
    every_token = tuple(range(CONFIG.vocab_size))
    stopped = Sampler(CONFIG, stop_ids=every_token).generate(
        params[0], CONTEXTS, max_new_tokens=5, temperature=1.0, key=jax.random.key(0))
    assert [len(t) for t in stopped.tokens] == [1, 1, 1]
    near_full = [[1] * (CONFIG.max_len - 2), [1, 5]]
    full = Sampler(CONFIG, stop_ids=()).generate(
        params[0], near_full, max_new_tokens=5, temperature=1.0, key=jax.random.key(0))
    assert [len(t) for t in full.tokens] == [2, 5]


def test_generation_is_seeded(params):
    sampler = Sampler(CONFIG)
    a, b, c = (sampler.generate(params[0], CONTEXTS, max_new_tokens=8, temperature=1.0, key=jax.random.key(s))
               for s in (0, 0, 1))
    assert all(np.array_equal(x, y) for x, y in zip(a.tokens, b.tokens))
    assert not all(np.array_equal(x, y) for x, y in zip(a.tokens, c.tokens))


def test_compiles_are_bounded_by_buckets(params):
    sampler = Sampler(CONFIG)

    def run(rows, length):
        sampler.generate(params[0], [[1] * length] * rows, max_new_tokens=3, temperature=1.0,
                         key=jax.random.key(length))

    run(4, 16)
    compiled = prefill._cache_size(), decode._cache_size()
    for rows in (3, 4):  # one batch bucket (4) ...
        for length in range(2, 17):  # ... and one prompt bucket (16): no new compiles
            run(rows, length)
    assert (prefill._cache_size(), decode._cache_size()) == compiled


def test_retract_switches_versions_mid_generation(params):
    old, new = params
    calls = []

    def refresh():
        calls.append(1)
        return (0, old) if len(calls) < 2 else (1, new)

    generation = Sampler(CONFIG, stop_ids=()).generate(
        old, CONTEXTS, max_new_tokens=20, temperature=1.0, key=jax.random.key(0),
        version=0, refresh=refresh, check_every=4, on_sync="retract")
    assert generation.version == 1 and not generation.aborted
    sampling = SamplingParams()
    for context, tokens, logprobs, versions in zip(
            CONTEXTS, generation.tokens, generation.logprobs, generation.versions):
        np.testing.assert_array_equal(versions, [0] * 8 + [1] * 12)  # switch noticed at the 2nd check
        assert versions.min() == 0  # the group's oldest version is the earlier one
        np.testing.assert_allclose(logprobs[:8], _recomputed_logprobs(old, context, tokens, sampling)[:8], atol=1e-5)
        np.testing.assert_allclose(logprobs[8:], _recomputed_logprobs(new, context, tokens, sampling, 8), atol=1e-5)


def test_finish_keeps_old_weights_and_abort_stops(params):
    old, new = params
    sampler = Sampler(CONFIG, stop_ids=())
    kwargs = dict(max_new_tokens=12, temperature=1.0, key=jax.random.key(0), version=3, check_every=4)
    finished = sampler.generate(old, CONTEXTS, refresh=lambda: (4, new), on_sync="finish", **kwargs)
    assert finished.version == 3 and all(np.all(v == 3) for v in finished.versions)
    assert [len(t) for t in finished.tokens] == [12, 12, 12]
    aborted = sampler.generate(old, CONTEXTS, refresh=lambda: (4, new), on_sync="abort", **kwargs)
    assert aborted.aborted and aborted.version == 3
    assert [len(t) for t in aborted.tokens] == [4, 4, 4]


def test_bad_arguments_raise_value_error(params):
    sampler = Sampler(CONFIG)
    with pytest.raises(ValueError, match="leave no room"):
        sampler.generate(params[0], [[1] * CONFIG.max_len], max_new_tokens=1, temperature=1.0, key=jax.random.key(0))
    with pytest.raises(ValueError, match="on_sync"):
        sampler.generate(params[0], CONTEXTS, max_new_tokens=1, temperature=1.0, key=jax.random.key(0),
                         on_sync="later")
