"""The sharded train step: one optimizer update of the policy on a packed batch.

`train_step` is a pure module-level function; `TrainStep` jits it once for a mesh,
with the state's shardings as its input and output shardings and the state donated,
so steps run without resharding or copying and compile once per bucket length.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

from learner import losses, sharding
from learner.batching import Batch
from learner.config import LearnerConfig, LossConfig, ModelConfig, OptimizerConfig
from learner.model import Forward, Params, forward_fn, init_params


class TrainState(NamedTuple):
    """Everything an update changes; a pure pytree, so Orbax saves and restores it as is."""

    params: Params
    opt_state: optax.OptState
    step: jax.Array  # int32 scalar: optimizer updates so far


def make_optimizer(config: OptimizerConfig) -> optax.GradientTransformation:
    """AdamW, after clipping the gradient's global norm to `max_grad_norm` if set."""
    adamw = optax.adamw(
        config.lr, b1=config.b1, b2=config.b2, eps=config.eps, weight_decay=config.weight_decay
    )
    if config.max_grad_norm is None:
        return adamw
    return optax.chain(optax.clip_by_global_norm(config.max_grad_norm), adamw)


def _init(model_config: ModelConfig, optimizer: optax.GradientTransformation, seed: int) -> TrainState:
    params = init_params(model_config, seed)
    return TrainState(params, optimizer.init(params), jnp.zeros((), jnp.int32))


def _state_shardings(abstract_state: TrainState, optimizer: optax.GradientTransformation, mesh: Mesh):
    params = sharding.param_shardings(abstract_state.params, mesh)
    opt_state = sharding.opt_state_shardings(optimizer, abstract_state.opt_state, params, mesh)
    return TrainState(params, opt_state, sharding.replicated(mesh))


def _abstract_and_shardings(model_config: ModelConfig, optimizer: optax.GradientTransformation, mesh: Mesh):
    abstract = jax.eval_shape(functools.partial(_init, model_config, optimizer, 0))
    return abstract, _state_shardings(abstract, optimizer, mesh)


def abstract_train_state(model_config: ModelConfig, learner_config: LearnerConfig, mesh: Mesh) -> TrainState:
    """The state's shapes, dtypes and shardings (ShapeDtypeStructs): the target of an Orbax restore."""
    optimizer = make_optimizer(learner_config.optimizer)
    abstract, shardings = _abstract_and_shardings(model_config, optimizer, mesh)
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)


def init_train_state(
    model_config: ModelConfig, learner_config: LearnerConfig, *, seed: int, mesh: Mesh
) -> TrainState:
    """A fresh state, created directly in its shards (no full copy on one device)."""
    optimizer = make_optimizer(learner_config.optimizer)
    _, shardings = _abstract_and_shardings(model_config, optimizer, mesh)
    init = jax.jit(functools.partial(_init, model_config, optimizer), out_shardings=shardings)
    return init(jnp.int32(seed))


def params_numpy(state: TrainState) -> dict[str, Any]:
    """The parameters as NumPy arrays on the host: what is published to the actors."""
    return jax.device_get(state.params)


def train_step(
    state: TrainState,
    batch: dict[str, jax.Array],
    *,
    forward: Forward,
    optimizer: optax.GradientTransformation,
    loss_config: LossConfig,
) -> tuple[TrainState, dict[str, jax.Array]]:
    """One update of the policy on a packed batch (the fields of `Batch`, as a dict).

    Returns:
      (new state, scalar metrics): the policy-loss metrics plus loss, entropy (mean
      over trained tokens), grad_norm (before clipping) and tokens (trained tokens).
    """

    def loss_fn(params):
        logits = forward(params, batch["tokens"], batch["positions"], batch["segment_ids"])
        logprobs = losses.token_logprobs(logits, batch["targets"])
        loss, metrics = losses.policy_loss(
            logprobs,
            batch["behaviour_logprobs"],
            batch["advantages"],
            batch["loss_mask"],
            batch["segment_ids"],
            loss_config,
        )
        entropy = losses.token_entropy(jax.lax.stop_gradient(logits))
        return loss, {**metrics, "entropy": losses.masked_mean(entropy, batch["loss_mask"])}

    (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = {
        **metrics,
        "loss": loss,
        "grad_norm": optax.tree.norm(grads),
        "tokens": jnp.sum(batch["loss_mask"]),
    }
    return TrainState(params, opt_state, state.step + 1), metrics


class TrainStep:
    """`train_step` jitted for one model, learner config and mesh.

    Call it with a state from `init_train_state` (or restored onto the same mesh)
    and a `Batch`; the state passed in is donated and must not be used again.
    """

    def __init__(self, model_config: ModelConfig, learner_config: LearnerConfig, mesh: Mesh):
        optimizer = make_optimizer(learner_config.optimizer)
        _, state_shardings = _abstract_and_shardings(model_config, optimizer, mesh)
        step = functools.partial(
            train_step,
            forward=forward_fn(model_config),
            optimizer=optimizer,
            loss_config=learner_config.loss,
        )
        self._batch_shards = mesh.shape["data"] * mesh.shape["fsdp"]
        self._jitted = jax.jit(
            step,
            in_shardings=(state_shardings, sharding.batch_sharding(mesh)),
            out_shardings=(state_shardings, sharding.replicated(mesh)),
            donate_argnums=0,
        )

    @property
    def compiles(self) -> int:
        """Compilations so far: one per distinct batch shape (bucket) seen."""
        # jit's own cache of compiled executables (private, but what jit consults
        # before compiling; tests/learner/test_train.py pins its meaning).
        return self._jitted._cache_size()

    def __call__(self, state: TrainState, batch: Batch) -> tuple[TrainState, dict[str, float]]:
        rows = batch.shape[0]
        if rows % self._batch_shards:
            raise ValueError(
                f"batch rows ({rows}) must be divisible by mesh data x fsdp ({self._batch_shards})"
            )
        arrays = {f.name: getattr(batch, f.name) for f in dataclasses.fields(batch)}
        state, metrics = self._jitted(state, arrays)
        metrics = {name: float(value) for name, value in jax.device_get(metrics).items()}
        return state, {**metrics, "padding": batch.padding}
