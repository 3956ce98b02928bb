"""The names of one learner session's Dask objects, and the signal that stops its actors;
every request to the scheduler here has a deadline."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Awaitable, Callable, TypeVar

from distributed import Client, Event, Queue

T = TypeVar("T")


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


SCHEDULER_TIMEOUT_S = 30.0  # one request to the scheduler: past this, it counts as hung


def on_scheduler(client: Client, request: Callable[[], Awaitable[T]], what: str,
                 timeout_s: float | None = None) -> T:
    """Runs `request` (a coroutine function of Dask calls) on the client's event loop, where
    Dask's queues, events and variables return awaitables; raises TimeoutError naming
    `what` if the scheduler has not answered within `timeout_s` (default SCHEDULER_TIMEOUT_S:
    hung, or unreachable)."""
    timeout_s = SCHEDULER_TIMEOUT_S if timeout_s is None else timeout_s
    try:
        return client.sync(request, callback_timeout=timeout_s)
    except TimeoutError:
        raise TimeoutError(f"{what}: the Dask scheduler {client.scheduler.address} did not answer "
                           f"within {timeout_s:.0f}s") from None


def release_actors(client: Client, channels: Channels, n_actors: int) -> None:
    """Tells a session's actors to stop: the stop event, and a `None` prompt to each.
    Raises TimeoutError if the scheduler does not take them in time."""

    async def release() -> None:
        await Event(channels.stop, client=client).set()
        queues = await asyncio.gather(*(_queue(client, channels.prompts(actor)) for actor in range(n_actors)))
        await asyncio.gather(*(queue.put(None) for queue in queues))

    on_scheduler(client, release, "telling the actors to stop")


def stop_actors(client: Client, channels: Channels, n_actors: int, *, done: Callable[[], bool] = lambda: False,
                timeout_s: float = 5.0) -> bool:
    """Releases a session's actors, then empties the buffer until `done()` or `timeout_s`,
    so that a producer blocked on a full buffer gets to its stop check. Returns whether
    `done()`; raises TimeoutError if the scheduler stops answering.

    The groups dropped stay "buffered" in the accounting: a checkpoint lists them to be redone."""
    release_actors(client, channels, n_actors)
    deadline = time.monotonic() + timeout_s
    buffer = on_scheduler(client, lambda: _queue(client, channels.buffer), "emptying the buffer")

    async def drain() -> None:
        await buffer.get(batch=True)

    while not done():
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        on_scheduler(client, drain, "emptying the buffer", timeout_s=max(left, 1.0))
        time.sleep(0.05)
    return True


async def _queue(client: Client, name: str) -> Queue:
    """The queue `name`, once the scheduler has it (it may not yet, if its learner died early)."""
    return await Queue(name, client=client)
