"""The Dask cluster the actors run on: a local cluster of processes, an existing scheduler,
or a cluster class (Slurm, Kubernetes, ...) that Tandem starts and scales."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from typing import Iterator

from dask.utils import parse_bytes
from distributed import LocalCluster
from distributed.system import MEMORY_LIMIT

from tasks.config import ActorsConfig
from tasks.placement import scheduler

# Actors share the machine with the learner: one XLA thread each keeps them from
# oversubscribing the cores the learner's step needs.
ACTOR_ENV = {
    "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1",
    "OMP_NUM_THREADS": "1",
    "JAX_PLATFORMS": "cpu",
}


@contextlib.contextmanager
def actor_cluster(config: ActorsConfig) -> Iterator[str]:
    """Yields the scheduler address of the cluster the spec names.

    A local cluster's workers inherit this process's environment, `PREFECT_API_URL`
    included, so anything Prefect they run reports to the same API. Workers started any
    other way need Tandem installed and, for the same reason, that variable set.
    """
    if config.cluster != "local":
        with scheduler(config.cluster, config.cluster_kwargs, config.workers, "actors.cluster") as address:
            yield address
        return
    env = {**{k: v for k, v in os.environ.items() if k.startswith("PREFECT_")}, **ACTOR_ENV}
    if config.resources:  # actors asked for an accelerator: JAX may use it
        env.pop("JAX_PLATFORMS")
    # One thread for the worker's actor task, which runs for the whole session, and
    # one for other work (an evaluation, say).
    with LocalCluster(n_workers=config.workers, threads_per_worker=2, processes=True, dashboard_address=":0",
                      env=env, resources=config.resources or None,
                      memory_limit=worker_memory_limit(config)) as cluster:
        try:
            yield cluster.scheduler_address
        except BaseException:
            _stop_workers_now(cluster)
            raise


def _stop_workers_now(cluster: LocalCluster) -> None:
    """Kills a local cluster's workers, their work abandoned (a Ctrl-C, a failure). Dask's
    own close retires a busy worker for seconds, its heartbeat meanwhile failing with a
    traceback on the terminal; a worker killed says nothing, and neither does its nanny
    (it warns that it had to kill it: here that is the point)."""

    async def kill(nannies: list) -> None:
        await asyncio.gather(*(n.close(timeout=0.1, reason="abandoned") for n in nannies), return_exceptions=True)

    nanny_log = logging.getLogger("distributed.nanny")
    level, nanny_log.level = nanny_log.level, logging.ERROR
    try:
        with contextlib.suppress(Exception):
            cluster.sync(kill, list(cluster.workers.values()))
    finally:
        nanny_log.setLevel(level)


# The share of the machine's memory the local cluster's workers get in all, unless
# `actors.memory_limit` says otherwise: the learner and the system keep the rest.
DEFAULT_MEMORY_SHARE = 0.5


def worker_memory_limit(config: ActorsConfig) -> int:
    """Bytes each local worker may use before Dask's nanny restarts it: `actors.memory_limit`
    as a size, or its fraction (default DEFAULT_MEMORY_SHARE) of the machine's memory
    (as Dask measures it: cgroup and rlimit included) divided among the workers."""
    limit = config.memory_limit if config.memory_limit is not None else DEFAULT_MEMORY_SHARE
    if isinstance(limit, str):
        return parse_bytes(limit)
    return int(limit * MEMORY_LIMIT / config.workers)
