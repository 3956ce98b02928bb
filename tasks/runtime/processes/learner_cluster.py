"""The learner's processes on a Dask cluster (`learner.cluster: tcp://...`, or a cluster
class): one on each of `learner.hosts` workers that carry a `learner` resource.

Each process is a Dask task pinned to its worker (`tasks.runtime.processes.learner_host` runs it
as a child there). Dask neither retries it nor moves it: a worker that dies leaves its
task nowhere to run, and its absence from the scheduler fails the attempt, as a local
process's death does (`tasks.runtime.processes.hosts`): the others are killed, and Prefect's
retry restarts all of them from the latest checkpoint, which every host must see (the
run directory on a filesystem shared at the same path).

The leader's events come through a Dask queue, and the learner task's signals go through
a Dask variable, both named after the session: every host already talks to the
scheduler, so nothing else needs a route (the flow's machine and the learner hosts may
not reach each other); a queue keeps the events in order; they are small (a few per
step), so the scheduler carries them at no cost that matters.
"""

from __future__ import annotations

import collections
import contextlib
import os
import pickle
import time
from typing import Any, Iterator

from distributed import Client, Future, Queue, Variable

from learner.config import LearnerConfig
from tasks.buffer.channels import SCHEDULER_TIMEOUT_S
from tasks.placement import free_port, process_environ, scheduler, workers_with
from tasks.runtime.processes.learner_host import END, RUN, STOP, TERMINATE, run_host
from tasks.runtime.processes.relay import Event

RESOURCE = "learner"  # the Dask worker resource of a learner host: one process each
WORKERS_WAIT_S = 60.0  # how long to wait for the learner workers to join the scheduler
CHECK_S = 1.0  # how often the learner workers' presence is checked


@contextlib.contextmanager
def learner_client(config: LearnerConfig) -> Iterator[Client]:
    """A client of the cluster `learner.cluster` names; a cluster class is built, scaled to
    `learner.hosts` workers, and closed after."""
    with (scheduler(config.cluster, config.cluster_kwargs, config.hosts, "learner.cluster") as address,
          Client(address, timeout=SCHEDULER_TIMEOUT_S, set_as_default=False) as client):
        yield client


def _workers(client: Client) -> dict[str, dict[str, Any]]:
    """The scheduler's learner workers: address -> its information (host, resources, ...)."""
    return workers_with(client, {RESOURCE: 1})


def learner_workers(client: Client, hosts: int, wait_s: float = WORKERS_WAIT_S) -> dict[str, dict[str, Any]]:
    """`hosts` learner workers (address -> information), waiting up to `wait_s` for them."""
    deadline = time.monotonic() + wait_s
    while len(workers := _workers(client)) < hosts:
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"learner.hosts is {hosts}, but the Dask scheduler {client.scheduler.address} has "
                f"{len(workers)} worker(s) with the `{RESOURCE}` resource after {wait_s:.0f} s: start them with "
                f"`dask worker {client.scheduler.address} --resources {RESOURCE}=1 --nthreads 1`")
        time.sleep(1.0)
    return dict(sorted(workers.items())[:hosts])


def cluster_environ(client: Client, workers: dict[str, dict[str, Any]]) -> list[dict[str, str]]:
    """For each process, what `learner.multihost.initialize` reads: the coordinator on
    process 0's host, as the scheduler knows it (other hosts reach it there), at a port
    free on that host; nothing for one host."""
    if len(workers) == 1:
        return [{}]
    first = next(iter(workers))
    port = client.run(free_port, workers=[first])[first]
    host = workers[first]["host"]
    return process_environ(f"[{host}]:{port}" if ":" in host else f"{host}:{port}", len(workers))


class ClusterProcesses:
    """Process 0 (the leader) and its followers on their learner workers, watched and
    stopped together: what `LearnerProcesses` does for local processes.

    Attributes:
      events: the leader's events, read as from a local leader's pipe.
      stop_flag: set, the leader ends training at its next version.
    """

    def __init__(self, client: Client, workers: dict[str, dict[str, Any]], mains: list[bytes], session: str):
        self._client, self._workers, self._mains = client, workers, mains
        self._name = f"tandem-learner-{session}"
        self._signals = Variable(f"{self._name}-signals", client=client)
        self.events = QueueEvents(Queue(f"{self._name}-events", client=client))
        self.stop_flag = _Signal(self._signals, STOP)
        self._futures: list[Future] = []
        self._left: int | None = None  # a process whose worker left the scheduler
        self._checked = 0.0

    def start(self) -> None:
        self._signals.set(RUN)
        for i, (main, worker) in enumerate(zip(self._mains, self._workers)):
            self._futures.append(self._client.submit(
                run_host, main, i == 0, self._signals.name, self.events.name if i == 0 else None, os.getcwd(),
                key=f"{self._name}-{i}", workers=[worker], allow_other_workers=False, resources={RESOURCE: 1},
                pure=False, retries=0))

    def _exit(self, i: int) -> int | str | None:
        """Process i's exit code; a message if its Dask task failed; None while it runs."""
        future = self._futures[i]
        if not future.done():
            return None
        if future.status == "error":
            return f"its Dask task failed: {future.exception(timeout=SCHEDULER_TIMEOUT_S)!r}"
        if future.status != "finished":
            return f"its Dask task was {future.status}"
        return future.result()

    def _dead_follower(self) -> int | None:
        """A follower that failed; one that exited cleanly has seen STOP."""
        return next((i for i in range(1, len(self._futures)) if self._exit(i) not in (None, 0)), None)

    def _host_left(self) -> int | None:
        """A process whose worker has left the scheduler; checked at most every CHECK_S. (A
        nanny restarts a worker at a new address, unless `--worker-port` fixes it; one back
        at the same address before the check would run the process again, which cannot
        rejoin the others: `jax.distributed` fails them all.)"""
        if self._left is None and time.monotonic() - self._checked > CHECK_S:
            self._checked = time.monotonic()
            present = _workers(self._client)
            self._left = next((i for i, address in enumerate(self._workers) if address not in present), None)
        return self._left

    def failed(self) -> bool:
        """A follower died, a host left, or the leader's Dask task failed. A leader that exited
        is not one here: its exit ends its events (`QueueEvents.gone`), after all it sent, so
        none is lost to a check made between two reads."""
        leader = self._exit(0)
        return isinstance(leader, str) or self._dead_follower() is not None or self._host_left() is not None

    def terminate(self) -> None:
        self._signals.set(TERMINATE)

    def stop(self, grace_s: float) -> None:
        """Gives the leader `grace_s` to end (none once another process has failed: it cannot),
        and its followers 10 s more if it ended cleanly; cancels the tasks of any still
        running, whose Dask tasks then kill them."""
        if self._dead_follower() is None and self._host_left() is None:
            _wait(self._futures[:1], grace_s)
        if self._exit(0) == 0:
            _wait(self._futures[1:], 10.0)
        self._client.cancel([future for future in self._futures if not future.done()])

    def death(self) -> str:
        """Why the attempt failed: a host that left, else the first process that died."""
        if (left := self._host_left()) is not None:
            return f"learner process {left}'s host left the Dask cluster (worker {list(self._workers)[left]})"
        if (follower := self._dead_follower()) is not None:
            return f"learner process {follower} died (exit code {self._exit(follower)})"
        return f"learner process died (exit code {self._exit(0)})"


def _wait(futures: list[Future], timeout_s: float) -> None:
    """Waits up to `timeout_s` for `futures` to be done (not `distributed.wait`: it needs
    a default client, and this one is not, so as not to be mistaken for the actors')."""
    deadline = time.monotonic() + timeout_s
    while not all(future.done() for future in futures) and time.monotonic() < deadline:
        time.sleep(0.1)


class QueueEvents:
    """The leader's events from its Dask queue, read as `relay.EventReader` reads a local
    leader's pipe: `gone` once its Dask task has put the last (END).

    It takes what the queue holds at each read rather than waiting in the scheduler for the
    next: a wait that times out is logged by the scheduler as an error, every time."""

    def __init__(self, queue: Queue):
        self._queue = queue
        self._pending: collections.deque = collections.deque()
        self.name = queue.name
        self.gone = False

    def started(self) -> None:
        """Nothing to do: the leader's pipe ends on its host, where its Dask task reads it."""

    def get(self, timeout_s: float) -> Event | None:
        if not self._pending and not self.gone:
            self._pending.extend(self._queue.get(batch=True))
            if not self._pending:
                time.sleep(timeout_s)
                return None
        if not self._pending:
            return None
        data = self._pending.popleft()
        if data is END:
            self.gone = True
            return None
        return pickle.loads(data)

    def close(self) -> None:
        self._queue.close()


class _Signal:
    """A flag the learner task sets (`_relay`: again on every pass) that sends its signal once."""

    def __init__(self, signals: Variable, value: str):
        self._signals, self._value, self._sent = signals, value, False

    def set(self) -> None:
        if not self._sent:
            self._sent = True
            self._signals.set(self._value)
