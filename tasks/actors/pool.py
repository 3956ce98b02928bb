"""The session's actors: long-running Dask futures, started together and stopped together.

Every request to the scheduler or a worker here has a deadline (SCHEDULER_TIMEOUT_S): a
hung scheduler or a dead worker fails the learner, or is given up on loudly while
stopping, instead of hanging it.
"""

from __future__ import annotations

import logging
from typing import Callable, Mapping

from distributed import Client

from tasks.actors.actor import ActorSetup, run_actor
from tasks.placement import workers_with
from tasks.buffer.channels import SCHEDULER_TIMEOUT_S, stop_actors

logger = logging.getLogger(__name__)


class ActorPool:
    def __init__(self, client: Client, setup: ActorSetup, n_actors: int, log: Callable[[str], None],
                 warn: Callable[[str], None] | None = None, resources: Mapping[str, float] | None = None,
                 detail: Callable[[str], None] = logger.debug):
        """`log`, `warn`: what a user reads (the learner task's log, the terminal); `detail`:
        the actors' own timings when they stop, for whoever debugs them (DEBUG by default:
        the terminal shows what is not routine, README "The two commands")."""
        self.client, self.setup, self.n_actors, self.log = client, setup, n_actors, log
        self.warn, self.detail = warn or log, detail
        self.resources = dict(resources or {})  # Dask worker resources each actor holds (`actors.resources`)
        self.futures: list = []

    def start(self) -> None:
        """One actor per worker while there are enough: each process has one engine.

        Actors are pinned to their workers only where there are several: a task pinned
        loosely (`allow_other_workers`) whose worker died while no other was alive waits in
        Dask's "no-worker" state for good, even once the nanny has restarted that worker."""
        workers = self._workers_with_resources()
        self.futures = []
        for i in range(self.n_actors):
            pinned = {"workers": [workers[i % len(workers)]], "allow_other_workers": True} if len(workers) > 1 else {}
            self.futures.append(self.client.submit(run_actor, i, self.setup, pure=False,
                                                   resources=self.resources or None,
                                                   key=f"actor-{i}-{self.setup.channels.session}", **pinned))

    def _workers_with_resources(self) -> list[str]:
        """The workers an actor may run on: those carrying `resources` (Dask places a task
        only on a worker that has them, pinned or not; until one joins, the actor waits)."""
        if not self.resources:
            return sorted(self.client.nthreads(callback_timeout=SCHEDULER_TIMEOUT_S))
        workers = list(workers_with(self.client, self.resources))
        if not workers:
            self.warn(f"no Dask worker has the resources {self.resources} (actors.resources) yet: "
                      "the actors wait for one")
        return workers

    def raise_if_failed(self) -> None:
        """Surfaces an actor's failure to the learner instead of letting it wait forever."""
        for future in self.futures:
            if future.status == "error":
                error = future.exception(timeout=SCHEDULER_TIMEOUT_S)
                raise RuntimeError(f"actor {future.key} failed: {type(error).__name__}: {error}") from error
            if future.done():
                raise RuntimeError(f"actor {future.key} stopped before the learner finished")

    def stop(self, timeout_s: float = 120.0) -> None:
        """Stops the actors (no new groups, blocked puts released), logs their timings.
        Gives up, loudly, after `timeout_s` or on a scheduler that does not answer."""
        try:
            stopped = stop_actors(self.client, self.setup.channels, self.n_actors, timeout_s=timeout_s,
                                  done=lambda: all(f.done() for f in self.futures))
        except TimeoutError as e:
            self.warn(f"could not stop the actors: {e}; they stop once their worker restarts "
                      "(restart the Dask cluster if it is yours)")
            return
        if not stopped:
            running = [f.key for f in self.futures if not f.done()]
            self.warn(f"actors {running} did not stop within {timeout_s:.0f}s (an environment call that hangs?); "
                      "given up on: the stop signal stays set, so each stops once its current wait returns")
        self._log_timings()
        self.client.cancel(self.futures)  # a message to the scheduler: it does not wait

    def _log_timings(self) -> None:
        for future in self.futures:
            if future.status != "finished":
                continue
            try:
                stats = future.result(timeout=SCHEDULER_TIMEOUT_S)
            except Exception as e:  # its worker died since: its timings are lost, nothing else
                self.detail(f"actor {future.key}: no timings ({type(e).__name__}: {e})")
                continue
            self.detail(timings_line(stats))


def timings_line(stats: dict) -> str:
    """An actor's timings (`run_actor`'s result) in one line."""
    return (f"actor {stats['actor']}: {stats['groups']} groups, rollout {stats['rollout_s']:.1f}s, "
            f"buffer put {stats['queue_put_s']:.1f}s, engine compiled in {stats.get('compile_s', 0.0):.1f}s "
            f"before its first prompt, engine compiles {stats['compiles']}, prefills {stats['prefix']}")
