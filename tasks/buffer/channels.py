"""The names of one learner session's Dask objects, and the signal that stops its actors."""

from __future__ import annotations

import dataclasses
import time
from typing import Callable

from distributed import Client, Event, Queue


@dataclasses.dataclass(frozen=True)
class Channels:
    """Names of one learner session's Dask queues, variable and event."""

    session: str

    def _name(self, what: str) -> str:
        return f"tandem-{self.session}-{what}"

    @property
    def buffer(self) -> str:
        return self._name("buffer")

    def prompts(self, actor: int) -> str:
        return self._name(f"prompts-{actor}")

    @property
    def reports(self) -> str:
        return self._name("reports")

    @property
    def weights(self) -> str:
        return self._name("weights")

    @property
    def weights_version(self) -> str:
        return self._name("weights-version")

    @property
    def stop(self) -> str:
        return self._name("stop")


def release_actors(client: Client, channels: Channels, n_actors: int) -> None:
    """Tells a session's actors to stop: the stop event, and a `None` prompt to each."""
    Event(channels.stop, client=client).set()
    for actor in range(n_actors):
        Queue(channels.prompts(actor), client=client).put(None)


def stop_actors(client: Client, channels: Channels, n_actors: int, *, done: Callable[[], bool] = lambda: False,
                timeout_s: float = 5.0) -> None:
    """Releases a session's actors, then empties the buffer until `done()` or `timeout_s`,
    so that a producer blocked on a full buffer gets to its stop check.

    The groups dropped stay "buffered" in the accounting: a checkpoint lists them to be redone."""
    release_actors(client, channels, n_actors)
    buffer, deadline = Queue(channels.buffer, client=client), time.monotonic() + timeout_s
    while not done() and time.monotonic() < deadline:
        buffer.get(batch=True)
        time.sleep(0.05)
