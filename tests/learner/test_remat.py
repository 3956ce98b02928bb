"""Activation rematerialisation (`LearnerConfig.remat`): the same values, recomputed."""

import re
import typing

import jax
import numpy as np
import pydantic
import pytest

from learner.batching import make_batch
from learner.config import LearnerConfig, MeshConfig, ModelConfig
from learner.losses import token_logprobs
from learner.model import Remat, forward_fn, init_params
from learner.sharding import make_mesh
from learner.train import TrainStep, init_train_state, params_numpy
from learner.trajectory import Sample

MODEL = ModelConfig(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64)


def _packed_row(length=16):
    rng = np.random.default_rng(0)
    tokens = rng.integers(3, MODEL.vocab_size, (2, length)).astype(np.int32)
    positions = np.concatenate([np.arange(10), np.arange(length - 10)])[None].repeat(2, 0).astype(np.int32)
    segments = np.concatenate([np.ones(10), np.full(length - 10, 2)])[None].repeat(2, 0).astype(np.int32)
    return tokens, positions, segments


def _loss(remat):
    forward = forward_fn(MODEL, remat=remat)

    def loss(params, tokens, positions, segments):
        logits = forward(params, tokens, positions, segments)
        return -token_logprobs(logits[:, :-1], tokens[:, 1:]).mean()

    return loss


def test_remat_leaves_the_loss_and_its_gradients_unchanged():
    params, row = init_params(MODEL, seed=0), _packed_row()
    loss, grads = jax.jit(jax.value_and_grad(_loss("none")))(params, *row)
    remat_loss, remat_grads = jax.jit(jax.value_and_grad(_loss("block")))(params, *row)
    np.testing.assert_allclose(remat_loss, loss, rtol=1e-6)
    for want, got in zip(jax.tree.leaves(grads), jax.tree.leaves(remat_grads)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


def _checkpoints(remat) -> int:
    """jax.checkpoint calls in the loss's jaxpr (printed "checkpoint" or "remat2", by JAX version)."""
    params, row = init_params(MODEL, seed=0), _packed_row()
    return len(re.findall(r"\b(?:checkpoint|remat\w*)\[", str(jax.make_jaxpr(_loss(remat))(params, *row))))


def test_remat_checkpoints_each_block_and_nothing_without_it():
    assert _checkpoints("block") == MODEL.n_layers
    assert _checkpoints("none") == 0


def test_a_train_step_with_remat_matches_one_without():
    mesh = make_mesh(MeshConfig(), devices=jax.devices()[:1])
    rng = np.random.default_rng(1)
    samples = [Sample(np.concatenate([[1], rng.integers(3, MODEL.vocab_size, n - 1)]).astype(np.int32),
                      np.full(n, -4.5, np.float32), np.where(np.arange(n) == 0, -1, 0).astype(np.int32), 0.0)
               for n in (9, 12, 7, 4)]
    batch = make_batch(samples, [1.0, -1.0, 0.5, -0.5], (16,), rows=2)
    results = {}
    for remat in ("none", "block"):
        learner = LearnerConfig(buckets=(16,), remat=remat)
        state = init_train_state(MODEL, learner, seed=0, mesh=mesh)
        state, metrics = TrainStep(MODEL, learner, mesh)(state, batch)
        results[remat] = metrics, params_numpy(state)
    (metrics, params), (remat_metrics, remat_params) = results["none"], results["block"]
    assert remat_metrics["loss"] == pytest.approx(metrics["loss"], rel=1e-6)
    assert remat_metrics["grad_norm"] == pytest.approx(metrics["grad_norm"], rel=1e-5)
    for want, got in zip(jax.tree.leaves(params), jax.tree.leaves(remat_params)):
        np.testing.assert_allclose(got, want, atol=1e-6)


def test_learner_config_validates_remat():
    assert LearnerConfig().remat == "none"
    assert LearnerConfig(remat="block").remat == "block"
    with pytest.raises(pydantic.ValidationError, match="remat"):
        LearnerConfig(remat="layer")
    # The model's own type and the spec field name the same choices.
    assert typing.get_args(LearnerConfig.model_fields["remat"].annotation) == typing.get_args(Remat)
