"""The device mesh and where parameters, optimizer state and batches live on it.

Mesh axes: "data" (batch rows), "fsdp" (batch rows, and every weight matrix split
along one dimension, gathered when used) and "tensor" (Megatron-style: attention
heads and the MLP hidden units split; column-parallel projections into them,
row-parallel projections out). jit's sharding propagation inserts the collectives.
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

    Vectors (norm scales) are replicated. A matrix is split over "tensor" along the
    dimension `_TENSOR_DIM` names for its module, if that dimension divides, and over
    "fsdp" along its largest remaining dimension that divides. Axes of size 1 are
    left out, so the spec names only real splits.
    """
    if len(shape) < 2:
        return P()
    spec: list[str | None] = [None] * len(shape)
    tensor, fsdp = mesh.shape["tensor"], mesh.shape["fsdp"]
    tensor_dim = _TENSOR_DIM.get(names[-2]) if len(names) >= 2 else None
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
