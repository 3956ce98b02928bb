"""The Dask cluster the actors run on: a local cluster of processes, or an existing scheduler."""

from __future__ import annotations

import contextlib
import os
from typing import Iterator

from distributed import LocalCluster

from tasks.config import ActorsConfig

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
    included, so anything Prefect they run reports to the same API.
    """
    if config.cluster != "local":
        yield config.cluster
        return
    env = {**{k: v for k, v in os.environ.items() if k.startswith("PREFECT_")}, **ACTOR_ENV}
    with LocalCluster(n_workers=config.workers, threads_per_worker=1, processes=True,
                      dashboard_address=None, env=env) as cluster:
        yield cluster.scheduler_address
