"""The sharded train step: one optimizer update of the policy on a packed batch.

`train_step` is a pure module-level function. Its forward and backward pass run in
a `jax.shard_map` over the batch axes (weights all-gathered over "fsdp", gradients
reduce-scattered back: see `learner.sharding`); the optimizer then updates each
shard where it lives. `TrainStep` jits it once for a mesh, with the state's
shardings as input and output shardings and the state donated, so steps run
without resharding or copying and compile once per batch shape (bucket length).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Iterator, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from learner import losses, multihost, sharding
from learner.batching import Batch, loss_positions
from learner.config import LearnerConfig, LossConfig, ModelConfig, OptimizerConfig
from learner.model import Forward, Params, forward_fn, init_params


class TrainState(NamedTuple):
    """Everything an update changes; a pure pytree, so Orbax saves and restores it as is.

    `reference` is a frozen copy of the initial parameters, kept only when the loss
    has a KL penalty (`loss.kl_coef > 0`): it costs one more copy of the parameters,
    sharded like them (params bytes / (fsdp * tensor) per device), and a forward
    pass per step; None otherwise.
    """

    params: Params
    opt_state: optax.OptState
    step: jax.Array  # int32 scalar: optimizer updates so far
    reference: Params | None = None


def learning_rate(config: OptimizerConfig) -> optax.ScalarOrSchedule:
    """`lr`, or its schedule: a linear warm-up, then a cosine decay, then constant."""
    if not config.scheduled:
        return config.lr
    after = (optax.constant_schedule(config.lr) if config.decay_steps is None
             else optax.cosine_decay_schedule(config.lr, config.decay_steps, alpha=config.min_lr_ratio))
    warmup = config.warmup_steps
    if not warmup:
        return after
    rise = optax.linear_schedule(config.lr / warmup, config.lr, warmup - 1)  # update k (from 0) at lr (k + 1) / warmup
    return optax.join_schedules([rise, after], [warmup])


def make_optimizer(config: OptimizerConfig) -> optax.GradientTransformation:
    """AdamW at `learning_rate(config)`, after clipping the gradient's global norm to
    `max_grad_norm` if set."""
    adamw = optax.adamw(
        learning_rate(config), b1=config.b1, b2=config.b2, eps=config.eps, weight_decay=config.weight_decay
    )
    if config.max_grad_norm is None:
        return adamw
    return optax.chain(optax.clip_by_global_norm(config.max_grad_norm), adamw)


def _init(model_config: ModelConfig, optimizer, keep_reference: bool, seed) -> TrainState:
    return _from_params(optimizer, keep_reference, init_params(model_config, seed))


def _from_params(optimizer, keep_reference: bool, params: Params) -> TrainState:
    # A copy, not the same arrays: the state is donated, and the reference must outlive it.
    reference = jax.tree.map(jnp.copy, params) if keep_reference else None
    return TrainState(params, optimizer.init(params), jnp.zeros((), jnp.int32), reference)


def _abstract_and_shardings(model_config: ModelConfig, learner_config: LearnerConfig, mesh: Mesh):
    optimizer = make_optimizer(learner_config.optimizer)
    keep_reference = learner_config.loss.kl_coef > 0
    abstract = jax.eval_shape(functools.partial(_init, model_config, optimizer, keep_reference, 0))
    params = sharding.param_shardings(abstract.params, mesh)
    opt_state = sharding.opt_state_shardings(optimizer, abstract.opt_state, params, mesh)
    shardings = TrainState(params, opt_state, sharding.replicated(mesh), params if keep_reference else None)
    return abstract, shardings


def abstract_train_state(model_config: ModelConfig, learner_config: LearnerConfig, mesh: Mesh) -> TrainState:
    """The state's shapes, dtypes and shardings (ShapeDtypeStructs): the target of an Orbax restore.

    Restoring onto a different mesh than the one saved from only needs this state's
    `mesh`: Orbax reads each shard of the new layout from the saved arrays.
    """
    abstract, shardings = _abstract_and_shardings(model_config, learner_config, mesh)
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)


def init_train_state(
    model_config: ModelConfig, learner_config: LearnerConfig, *, seed: int, mesh: Mesh,
    params: Params | None = None,
) -> TrainState:
    """A fresh state, created directly in its shards (no full copy on one device): random
    weights, those of the Hugging Face checkpoint `model.init` names, or `params` (a
    warm-up's, say: any layout, resharded here), with a new optimizer state."""
    _, shardings = _abstract_and_shardings(model_config, learner_config, mesh)
    optimizer = make_optimizer(learner_config.optimizer)
    keep_reference = learner_config.loss.kl_coef > 0
    if params is not None or model_config.init != "random":
        if params is None:
            from learner.hf import load_params  # reads safetensors; only needed for real models

            params = load_params(model_config)
        params = jax.device_put(params, shardings.params)
        init = jax.jit(functools.partial(_from_params, optimizer, keep_reference), out_shardings=shardings)
        return init(params)
    init = jax.jit(functools.partial(_init, model_config, optimizer, keep_reference), out_shardings=shardings)
    return init(jnp.int32(seed))


def params_numpy(state: TrainState) -> dict[str, Any]:
    """The parameters as NumPy arrays on the host: what is published to the actors."""
    return multihost.host_numpy(state.params)


# The per-token fields a loss reads; with "select" in a batch, at those positions only.
_PER_TOKEN = ("targets", "loss_mask", "behaviour_logprobs", "advantages", "segment_ids")


def _selected(batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """`batch` with its per-token fields at the positions "select" names ([R, K], from
    `batching.loss_positions`), which are those the output head runs at; as is without."""
    select = batch.get("select")
    if select is None:
        return batch
    return {**batch, **{name: jnp.take_along_axis(batch[name], select, axis=1) for name in _PER_TOKEN}}


def _logits(forward: Forward, params: Params, batch: dict[str, jax.Array]) -> jax.Array:
    return forward(params, batch["tokens"], batch["positions"], batch["segment_ids"], batch.get("select"))


def _sequence_logprobs(forward: Forward, params: Params, batch: dict[str, jax.Array]) -> jax.Array:
    return losses.token_logprobs(_logits(forward, params, batch), _selected(batch)["targets"])


def proximal_logprobs(params: Params, batch: dict[str, jax.Array], *, forward: Forward) -> jax.Array:
    """[R, L] log-probs of the batch's targets under `params`: the proximal policy's ([R, K]
    at the positions "select" names, if the batch has it)."""
    return _sequence_logprobs(forward, params, batch)


def _device_loss(params, reference, whole_batch, *, forward: Forward, loss_config: LossConfig):
    """This device's share of the loss on its rows, and metrics over all rows."""
    logits = _logits(forward, params, whole_batch)
    batch = _selected(whole_batch)
    logprobs = losses.token_logprobs(logits, batch["targets"])
    if loss_config.objective == "supervised":
        return losses.supervised_loss(logprobs, batch["loss_mask"], batch["segment_ids"], loss_config.aggregation,
                                      axis_name=sharding.BATCH_AXES)
    # Without recomputed proximal log-probs this update is the batch's first, so the
    # weights now are the proximal policy's (the weights at the start of the step).
    proximal = batch.get("proximal_logprobs", jax.lax.stop_gradient(logprobs))
    reference_logprobs = None
    if reference is not None:
        reference_logprobs = jax.lax.stop_gradient(_sequence_logprobs(forward, reference, whole_batch))
    loss, metrics = losses.policy_loss(
        logprobs,
        batch["behaviour_logprobs"],
        batch["advantages"],
        batch["loss_mask"],
        batch["segment_ids"],
        loss_config,
        proximal_logprobs=proximal,
        reference_logprobs=reference_logprobs,
        axis_name=sharding.BATCH_AXES,
    )
    entropy = losses.token_entropy(logits if loss_config.entropy_coef else jax.lax.stop_gradient(logits))
    if loss_config.entropy_coef:  # an entropy bonus against collapse (Williams & Peng 1991; Mnih et al. 2016)
        loss -= loss_config.entropy_coef * losses.aggregate_share(
            entropy, batch["loss_mask"].astype(jnp.float32), batch["segment_ids"], loss_config.aggregation,
            sharding.BATCH_AXES)
    mean_entropy = losses.masked_mean(jax.lax.stop_gradient(entropy), batch["loss_mask"], sharding.BATCH_AXES)
    return loss, {**metrics, "entropy": mean_entropy}


def _device_gradients(params, reference, batch, *, shardings, **loss_kwargs):
    """Runs on each device's shards (inside shard_map): gather, differentiate, reduce-scatter."""
    whole = sharding.gather_weights(params, shardings)
    whole_reference = None if reference is None else sharding.gather_weights(reference, shardings)
    grad_fn = jax.value_and_grad(_device_loss, has_aux=True)
    (loss_share, metrics), grads = grad_fn(whole, whole_reference, batch, **loss_kwargs)
    metrics = {
        **metrics,
        "loss": jax.lax.psum(loss_share, sharding.BATCH_AXES),
        "tokens": jax.lax.psum(jnp.sum(batch["loss_mask"]), sharding.BATCH_AXES),
    }
    return sharding.reduce_gradients(grads, shardings), metrics


def _gradients(state: TrainState, batch, *, forward, loss_config, mesh):
    """Gradients (sharded as the params) and metrics, the data/FSDP collectives explicit."""
    shardings = sharding.param_shardings(state.params, mesh)
    weight_specs = jax.tree.map(lambda s: sharding.manual_spec(s.spec), shardings)
    reference_specs = None if state.reference is None else weight_specs
    batch_specs = {name: P(sharding.BATCH_AXES, None) for name in batch}
    device_fn = functools.partial(_device_gradients, shardings=shardings, forward=forward, loss_config=loss_config)
    if mesh.shape["data"] * mesh.shape["fsdp"] == 1 and mesh.shape["tensor"] > 1:
        return _one_batch_shard(device_fn, state.params, state.reference, batch)
    # check_vma off: every cross-device sum is written out, none left for AD to insert.
    return jax.shard_map(
        device_fn,
        mesh=mesh,
        in_specs=(weight_specs, reference_specs, batch_specs),
        out_specs=(weight_specs, P()),
        axis_names=set(sharding.BATCH_AXES),
        check_vma=False,
    )(state.params, state.reference, batch)


def _one_batch_shard(device_fn, *args):
    """`device_fn` on a mesh of one batch shard beside "tensor" (data = fsdp = 1).

    XLA (jax 0.10.2) rejects every cross-device sum of a shard_map whose manual axes all
    have size 1 beside an automatic one ("Cross-partition allreduce must be in (partial)
    manual partitioning mode"). With one batch shard nothing needs to be manual: the
    batch axes are bound by vmaps of size one, where each collective is the identity,
    and "tensor" stays automatic as under the shard_map.
    """
    for axis in reversed(sharding.BATCH_AXES):
        device_fn = jax.vmap(device_fn, axis_name=axis)
    out = device_fn(*jax.tree.map(lambda a: a[None, None], args))
    return jax.tree.map(lambda a: a[0, 0], out)


def train_step(
    state: TrainState,
    batch: dict[str, jax.Array],
    *,
    forward: Forward,
    optimizer: optax.GradientTransformation,
    loss_config: LossConfig,
    mesh: Mesh,
) -> tuple[TrainState, dict[str, jax.Array]]:
    """One update of the policy on a packed batch (the fields of `Batch`, as a dict).

    `batch` may add "proximal_logprobs" ([R, L], from `proximal_logprobs`) for the
    later updates of a batch under "decoupled-ppo".

    Returns:
      (new state, scalar metrics): the policy-loss metrics plus loss, entropy (mean
      over trained tokens), grad_norm (before clipping) and tokens (trained tokens).
    """
    grads, metrics = _gradients(state, batch, forward=forward, loss_config=loss_config, mesh=mesh)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = {**metrics, "grad_norm": optax.tree.norm(grads)}
    return TrainState(params, opt_state, state.step + 1, state.reference), metrics


class TrainStep:
    """`train_step` jitted for one model, learner config and mesh.

    Call it with a state from `init_train_state` (or restored onto the same mesh)
    and a `Batch`; the state passed in is donated and must not be used again. With
    several hosts, each passes the rows it feeds (`multihost.host_batch`).
    """

    def __init__(self, model_config: ModelConfig, learner_config: LearnerConfig, mesh: Mesh):
        _, state_shardings = _abstract_and_shardings(model_config, learner_config, mesh)
        forward = forward_fn(model_config)  # the proximal log-probs: no gradient, nothing to recompute
        step = functools.partial(
            train_step,
            forward=forward_fn(model_config, remat=learner_config.remat),
            optimizer=make_optimizer(learner_config.optimizer),
            loss_config=learner_config.loss,
            mesh=mesh,
        )
        self._config = learner_config
        self._batch_sharding = sharding.batch_sharding(mesh)
        self._batch_shards = mesh.shape["data"] * mesh.shape["fsdp"]
        self._jitted = jax.jit(
            step,
            in_shardings=(state_shardings, self._batch_sharding),
            out_shardings=(state_shardings, sharding.replicated(mesh)),
            donate_argnums=0,
        )
        self._proximal = jax.jit(
            functools.partial(proximal_logprobs, forward=forward),
            in_shardings=(state_shardings.params, self._batch_sharding),
            out_shardings=self._batch_sharding,
        )

    @property
    def compiles(self) -> int:
        """Compilations of the update so far: one per distinct batch shape (bucket) seen, and
        per size of its trained positions (`batching.loss_positions`: at most three a bucket)."""
        # jit's own cache of compiled executables (private, but what jit consults
        # before compiling; tests/learner/test_train.py pins its meaning).
        return self._jitted._cache_size()

    def lower(self, state: TrainState, batch: Batch) -> jax.stages.Lowered:
        """The update lowered for `batch`'s shape without running it (nothing is donated):
        `.compile()` gives the executable and its per-device `memory_analysis()`."""
        return self._jitted.lower(state, self._device_batch(batch))

    def _device_batch(self, batch: Batch) -> dict[str, jax.Array]:
        rows = batch.shape[0] * jax.process_count()
        if rows % self._batch_shards:
            raise ValueError(
                f"batch rows ({rows}) must be divisible by mesh data x fsdp ({self._batch_shards})"
            )
        arrays = {f.name: getattr(batch, f.name) for f in dataclasses.fields(batch)}
        # One host's rows alone cannot size K for all hosts' (the global array's one shape).
        select = loss_positions(batch.loss_mask) if jax.process_count() == 1 else None
        if select is not None:
            arrays["select"] = select
        return multihost.global_batch(arrays, self._batch_sharding)

    def __call__(
        self, state: TrainState, batch: Batch, *, proximal_logprobs: jax.Array | None = None
    ) -> tuple[TrainState, dict[str, float]]:
        """One optimizer update on the whole of `batch`."""
        arrays = self._device_batch(batch)
        if proximal_logprobs is not None:
            arrays["proximal_logprobs"] = proximal_logprobs
        state, metrics = self._jitted(state, arrays)
        metrics = {name: float(value) for name, value in jax.device_get(metrics).items()}
        return state, {**metrics, "padding": batch.padding}

    def updates(self, state: TrainState, batch: Batch) -> Iterator[tuple[TrainState, dict[str, float]]]:
        """The `minibatches * epochs` updates of one batch, one step each, in order.

        Each minibatch is a contiguous slice of the rows, visited in the same order
        every epoch. Under "decoupled-ppo" the proximal log-probs of every minibatch
        are computed first, with the weights of the batch's first update. Yields
        (state, metrics) after each update; only the latest state may be used.
        """
        minibatches = batch.split(self._config.minibatches)
        proximal: list[jax.Array | None] = [None] * len(minibatches)
        if self._config.loss.objective == "decoupled-ppo" and self._config.updates_per_batch > 1:
            proximal = [self._proximal(state.params, self._device_batch(mb)) for mb in minibatches]
        for _ in range(self._config.epochs):
            for minibatch, minibatch_proximal in zip(minibatches, proximal):
                state, metrics = self(state, minibatch, proximal_logprobs=minibatch_proximal)
                yield state, metrics
