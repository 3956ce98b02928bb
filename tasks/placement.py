"""Where Tandem's processes run: the Dask cluster a spec field names (a scheduler's address,
or a cluster class that Tandem starts and scales), the workers that carry a resource, and
the environment that joins several processes of one JAX program.

The actors (`tasks.actors.cluster`), the learner's hosts (`tasks.runtime.processes.learner_cluster`,
`tasks.runtime.processes.hosts`) and evaluation (`tasks.eval.task`) all place their work here.
"""

from __future__ import annotations

import contextlib
import socket
from typing import Any, Iterator, Mapping

from distributed import Client

from learner.config import FieldError
from tasks.entrypoints import load


def cluster_class(name: str, field: str = "actors.cluster") -> type:
    """The cluster class "module:Class" (e.g. "dask_jobqueue:SLURMCluster") that `field` names."""
    try:
        return load(name, {}, "cluster class")
    except ValueError as e:  # raised where the field is not in sight: name it
        raise FieldError(field, str(e)) from None


@contextlib.contextmanager
def scheduler(cluster: str, cluster_kwargs: Mapping[str, Any], workers: int, field: str) -> Iterator[str]:
    """The address of the scheduler `cluster` names: itself if it is an address
    ("tcp://..."); else a cluster of class `cluster`, built with `cluster_kwargs`, scaled
    to `workers` and closed after."""
    if "://" in cluster:
        yield cluster
        return
    with cluster_class(cluster, field)(**cluster_kwargs) as started:
        started.scale(workers)
        yield started.scheduler_address


def workers_with(client: Client, resources: Mapping[str, float]) -> dict[str, dict[str, Any]]:
    """The workers carrying at least `resources` (all of them for none), address ->
    the scheduler's information on it, by address: the only ones Dask runs a task asking
    for those resources on."""
    info = client.scheduler_info(n_workers=-1)["workers"]
    return {address: worker for address, worker in sorted(info.items())
            if all(worker.get("resources", {}).get(name, 0) >= amount for name, amount in resources.items())}


def free_port(host: str = "") -> int:
    """A port free on this machine now (on `host`'s interface; all of them for "")."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def process_environ(coordinator: str, processes: int) -> list[dict[str, str]]:
    """For each of `processes` processes of one JAX program, what
    `learner.multihost.initialize` reads: process 0's coordinator at `coordinator`
    ("host:port"), and the process's index; nothing for one process."""
    from learner.multihost import COORDINATOR_ENV, PROCESS_ID_ENV  # JAX: not for `tandem validate`

    if processes == 1:
        return [{}]
    return [{COORDINATOR_ENV: coordinator, PROCESS_ID_ENV: str(i)} for i in range(processes)]
