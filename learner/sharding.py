"""The device mesh and where parameters, optimizer state and batches live on it.

Mesh axes: "data" (batch rows), "fsdp" (batch rows, and every weight matrix split
along one dimension, gathered when used) and "tensor" (Megatron-style: attention
heads and the MLP hidden units split; column-parallel projections into them,
row-parallel projections out).

The data/FSDP pattern is explicit: the train step runs its forward and backward
pass in a `jax.shard_map` that is manual over "data" and "fsdp", all-gathers each
weight over "fsdp" (`gather_weights`) and reduce-scatters its gradient back to the
weight's shards (`reduce_gradients`). "tensor" stays automatic inside it: XLA's
sharding propagation places the tensor-parallel collectives.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import numpy as np
import optax
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from learner.config import MeshConfig

AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

# Which dimension of a weight the "tensor" axis splits, by the name of the module
# that owns it: out-features of projections into heads / hidden units (column
# parallel), in-features of projections out of them (row parallel), vocabulary of
# the embedding and the output head.
_TENSOR_DIM = {"q": 1, "k": 1, "v": 1, "gate": 1, "up": 1, "lm_head": 1, "o": 0, "down": 0, "embed": 0}


def make_mesh(config: MeshConfig, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A ("data", "fsdp", "tensor") mesh over `devices` (default: all devices).

    Raises:
      ValueError: data * fsdp * tensor is not the number of devices (data = -1
        takes whatever the other axes leave, which must be a whole number).
    """
    devices = list(jax.devices() if devices is None else devices)
    model_parallel = config.fsdp * config.tensor
    data = len(devices) // model_parallel if config.data == -1 else config.data
    if data < 1 or data * model_parallel != len(devices):
        raise ValueError(
            f"mesh data={config.data} x fsdp={config.fsdp} x tensor={config.tensor} does not "
            f"match the {len(devices)} available devices"
        )
    shape = (data, config.fsdp, config.tensor)
    return jax.make_mesh(shape, AXES, axis_types=(AxisType.Auto,) * len(AXES), devices=devices)


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Rows of an [R, L] batch split over "data" and "fsdp"; tokens within a row kept together."""
    return NamedSharding(mesh, P(BATCH_AXES, None))


def weight_spec(names: Sequence[str], shape: Sequence[int], mesh: Mesh) -> P:
    """Partition spec of one weight, from its path in the params dict and its shape.

    A matrix is split over "tensor" along the dimension `_TENSOR_DIM` names for its
    module, if that dimension divides. Every weight, vectors (norm scales) too, is
    split over "fsdp" along its largest remaining dimension that divides, so each
    parameter is stored once per fsdp x tensor devices. Axes of size 1 are left
    out, so the spec names only real splits.
    """
    spec: list[str | None] = [None] * len(shape)
    tensor, fsdp = mesh.shape["tensor"], mesh.shape["fsdp"]
    tensor_dim = _TENSOR_DIM.get(names[-2]) if len(names) >= 2 and len(shape) == 2 else None
    if tensor > 1 and tensor_dim is not None and shape[tensor_dim] % tensor == 0:
        spec[tensor_dim] = "tensor"
    free = [d for d in range(len(shape)) if spec[d] is None and shape[d] % fsdp == 0]
    if fsdp > 1 and free:
        spec[max(free, key=lambda d: shape[d])] = "fsdp"
    return P(*spec)


def param_shardings(params: Any, mesh: Mesh) -> Any:
    """NamedSharding for each leaf of a params tree (arrays or ShapeDtypeStructs)."""

    def leaf_sharding(path, leaf):
        names = [str(getattr(k, "key", k)) for k in path]
        return NamedSharding(mesh, weight_spec(names, np.shape(leaf), mesh))

    return jax.tree_util.tree_map_with_path(leaf_sharding, params)


def opt_state_shardings(
    optimizer: optax.GradientTransformation, opt_state: Any, params_sharding: Any, mesh: Mesh
) -> Any:
    """Optimizer state sharded like the parameters it mirrors (Adam's moments); the rest replicated."""
    return optax.tree_map_params(
        optimizer,
        lambda _, sharding: sharding,
        opt_state,
        params_sharding,
        transform_non_params=lambda _: replicated(mesh),
    )


def fsdp_dim(spec: P) -> int | None:
    """The dimension of a weight that "fsdp" splits, or None if it is whole on each device."""
    return next((d for d, axis in enumerate(spec) if axis == "fsdp"), None)


def manual_spec(spec: P) -> P:
    """The part of `spec` a shard_map manual over the batch axes names: "tensor" left out."""
    return P(*(axis if axis == "fsdp" else None for axis in spec))


def gather_weights(shards: Any, shardings: Any) -> Any:
    """Inside the shard_map: each weight all-gathered over "fsdp" to its whole (per tensor shard)."""

    def gather(shard, sharding):
        dim = fsdp_dim(sharding.spec)
        return shard if dim is None else jax.lax.all_gather(shard, "fsdp", axis=dim, tiled=True)

    return jax.tree.map(gather, shards, shardings)


def reduce_gradients(grads: Any, shardings: Any) -> Any:
    """Inside the shard_map: per-device gradients of whole weights, summed over the batch
    axes and left split as the weights are (a reduce-scatter over "fsdp", an all-reduce
    over "data"; a weight that "fsdp" does not split is all-reduced over both)."""

    def reduce(grad, sharding):
        dim = fsdp_dim(sharding.spec)
        if dim is None:
            return jax.lax.psum(grad, BATCH_AXES)
        grad = jax.lax.psum_scatter(grad, "fsdp", scatter_dimension=dim, tiled=True)
        return jax.lax.psum(grad, "data")

    return jax.tree.map(reduce, grads, shardings)
