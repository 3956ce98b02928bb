"""The session's actors: long-running Dask futures, started together and stopped together."""

from __future__ import annotations

from typing import Callable

from distributed import Client

from tasks.actors.actor import ActorSetup, run_actor
from tasks.buffer.channels import stop_actors


class ActorPool:
    def __init__(self, client: Client, setup: ActorSetup, n_actors: int, log: Callable[[str], None]):
        self.client, self.setup, self.n_actors, self.log = client, setup, n_actors, log
        self.futures: list = []

    def start(self) -> None:
        """One actor per worker while there are enough: each process has one engine."""
        workers = sorted(self.client.scheduler_info()["workers"])
        self.futures = [self.client.submit(run_actor, i, self.setup, pure=False, allow_other_workers=True,
                                           workers=[workers[i % len(workers)]] if workers else None,
                                           key=f"actor-{i}-{self.setup.channels.session}")
                        for i in range(self.n_actors)]

    def raise_if_failed(self) -> None:
        """Surfaces an actor's failure to the learner instead of letting it wait forever."""
        for future in self.futures:
            if future.status == "error":
                error = future.exception()
                raise RuntimeError(f"actor {future.key} failed: {type(error).__name__}: {error}") from error
            if future.done():
                raise RuntimeError(f"actor {future.key} stopped before the learner finished")

    def stop(self, timeout_s: float = 120.0) -> None:
        """Stops the actors (no new groups, blocked puts released), logs their timings."""
        stop_actors(self.client, self.setup.channels, self.n_actors, timeout_s=timeout_s,
                    done=lambda: all(f.done() for f in self.futures))
        for future in self.futures:
            if future.status == "finished":
                stats = future.result()
                self.log(f"actor {stats['actor']}: {stats['groups']} groups, rollout "
                         f"{stats['rollout_s']:.1f}s, buffer put {stats['queue_put_s']:.1f}s")
        self.client.cancel(self.futures)
