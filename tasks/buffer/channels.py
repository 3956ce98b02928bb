"""The names of one learner session's Dask objects, and the signal that stops its actors."""

from __future__ import annotations

import dataclasses
import time
from typing import Callable

from distributed import Client, Event, Queue


def _named(what: str) -> property:
    return property(lambda self: f"tandem-{self.session}-{what}")


@dataclasses.dataclass(frozen=True)
class Channels:
    """Names of one learner session's Dask queues, variables and event."""

    session: str

    buffer = _named("buffer")  # the Queue of groups (inline) and their futures
    reports = _named("reports")  # the Queue of the actors' reports to the learner
    weights_version = _named("weights-version")  # the Variable: the latest version and its URL
    stop = _named("stop")  # the Event that tells actors to stop

    def prompts(self, actor: int) -> str:
        """The Queue of prompt messages to `actor`."""
        return f"tandem-{self.session}-prompts-{actor}"


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
