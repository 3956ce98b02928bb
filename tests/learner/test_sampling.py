"""The sampling distribution: temperature, top-k and top-p, by hand."""

import jax.numpy as jnp
import numpy as np
import pytest

from learner.sampling import SamplingParams, sampling_logprobs


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
