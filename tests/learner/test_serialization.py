"""Weights as bytes and back, as they travel from the learner to the actors: exact, in the
safetensors layout (the `safetensors` package reads what is written here, and the other
way round), bfloat16 included."""

import ml_dtypes
import numpy as np
from safetensors.numpy import load, save

from learner.serialization import params_from_bytes, params_to_bytes


def _params():
    rng = np.random.default_rng(0)
    return {"embed": {"embedding": rng.standard_normal((5, 4), np.float32)},
            "blocks": {0: {"attn": {"q": {"kernel": rng.standard_normal((4, 3)).astype(ml_dtypes.bfloat16)}}},
                       1: {"norm": {"scale": np.ones(3, np.float32)}}}}


def test_a_tree_of_float32_and_bfloat16_arrays_comes_back_exactly():
    params = _params()
    back = params_from_bytes(bytes(params_to_bytes(params)))
    for path in (("embed", "embedding"), ("blocks", 0, "attn", "q", "kernel"), ("blocks", 1, "norm", "scale")):
        want, got = params, back
        for key in path:
            want, got = want[key], got[key]
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


def test_the_layout_is_safetensors():
    float32 = {"a": {"b": np.arange(6, dtype=np.float32).reshape(2, 3)}, "c": np.arange(3, dtype=np.int32)}
    theirs = load(bytes(params_to_bytes(float32)))
    np.testing.assert_array_equal(theirs["a/b"], float32["a"]["b"])
    np.testing.assert_array_equal(params_from_bytes(save({"a/b": float32["a"]["b"]}))["a"]["b"], float32["a"]["b"])
