"""A learner over several processes (hosts): joining them and feeding each its rows.

Every process runs the same program on the same global arrays (JAX's multi-controller
model); each holds only its own devices' shards. A host builds the rows of the batch
its devices train on, and `global_batch` assembles the global batch from them
without any host ever holding the whole.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding

from learner.batching import Batch

COORDINATOR_ENV = "TANDEM_COORDINATOR_ADDRESS"  # host:port of process 0
PROCESS_ID_ENV = "TANDEM_PROCESS_ID"  # 0 .. hosts - 1


def initialize(hosts: int, environ: Mapping[str, str] = os.environ) -> None:
    """Joins this process to the `hosts` processes of one learner; nothing for one host.

    Must run before anything touches a JAX device. The coordinator address and
    this process's id come from TANDEM_COORDINATOR_ADDRESS and TANDEM_PROCESS_ID,
    as a launcher (Slurm, Kubernetes, a Prefect worker per host) would set them.

    Raises:
      ValueError: hosts > 1 and either variable is missing or the id is out of range.
    """
    if hosts == 1:
        return
    missing = [name for name in (COORDINATOR_ENV, PROCESS_ID_ENV) if name not in environ]
    if missing:
        raise ValueError(f"learner.hosts={hosts} needs the environment variables {missing}")
    process_id = int(environ[PROCESS_ID_ENV])
    if not 0 <= process_id < hosts:
        raise ValueError(f"{PROCESS_ID_ENV}={process_id} is outside 0..{hosts - 1} (learner.hosts)")
    # CPU devices of different processes reach each other only through a collectives
    # library; the setting is read on CPU only, so it is harmless on accelerators.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=environ[COORDINATOR_ENV], num_processes=hosts, process_id=process_id
    )


def host_batch(batch: Batch, minibatches: int = 1) -> Batch:
    """This process's rows of a batch that every host built whole: its 1/hosts slice of
    each minibatch, so that minibatch j of these rows, assembled over the hosts in process
    order (`global_batch`), is minibatch j of the whole batch, row for row."""
    hosts, index = jax.process_count(), jax.process_index()
    if hosts == 1:
        return batch
    parts = [minibatch.split(hosts)[index] for minibatch in batch.split(minibatches)]
    return Batch(**{f.name: np.concatenate([getattr(p, f.name) for p in parts])
                    for f in dataclasses.fields(Batch)})


def share(tree: Any) -> Any:
    """Process 0's value of a tree of NumPy arrays, on every process. Every process calls it
    with arrays of the same shapes and dtypes (the others' values are ignored)."""
    return multihost_utils.broadcast_one_to_all(tree)


def global_batch(local: Mapping[str, np.ndarray], sharding: NamedSharding) -> dict[str, jax.Array]:
    """Global [hosts * R, L] arrays from each process's [R, L] rows, in process order.

    Process i's rows become rows i*R .. (i+1)*R - 1, which the mesh (devices ordered
    by process) places on process i's devices: no rows cross hosts.
    """

    def assemble(rows: np.ndarray) -> jax.Array:
        shape = (rows.shape[0] * jax.process_count(), *rows.shape[1:])
        return jax.make_array_from_process_local_data(sharding, rows, shape)

    return {name: assemble(rows) for name, rows in local.items()}


def host_numpy(tree: Any) -> Any:
    """Whole NumPy copies of (possibly multi-host) global arrays, on every process."""
    if jax.process_count() == 1:
        return jax.device_get(tree)
    return multihost_utils.process_allgather(tree, tiled=True)
