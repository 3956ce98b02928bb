"""The weight source: the one owner of the version, and of publishing the learner's weights.

One sync every `sync.interval` steps publishes the current weights and increments the
version (README, "Versions, staleness, the buffer"). Publishing runs in a thread of its own,
so the learner hands host params over and goes on training while they travel; only the
newest version waiting is sent (actors want the latest; a version superseded before it
left would never be used). Two versions are read elsewhere, and only here are they set:
`current`, the learner's latest (the staleness clock of the buffer's exit check), and
`visible`, the latest the actors can use (admission control counts from it).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Protocol

from distributed import Client, Variable

from learner.serialization import params_to_chunks
from tasks.background import Background
from tasks.buffer.channels import Channels
from tasks.runtime.session.weight_server import WeightServer, address_towards


class Transport(Protocol):
    """Makes (version, params) the latest the actors see; returns once they can."""

    def send(self, version: int, params: Any) -> None: ...

    def close(self) -> None: ...


class HttpTransport:
    """Serves each version's params from the learner's own process, over HTTP.

    The scheduler carries only the version and its address (a `distributed.Variable`), so
    a publish costs the scheduler O(1) whatever the model's size, each actor process
    fetches O(model) bytes once per version, and no Dask worker holds the only copy (a
    worker that dies takes nothing with it). The server listens on the address this
    host reaches the scheduler from, so remote workers can reach it too.
    """

    def __init__(self, channels: Channels, client: Client):
        self._server = WeightServer(address_towards(client.scheduler.address))
        self._version = Variable(channels.weights_version, client=client)

    def send(self, version: int, params: Any) -> None:
        self._server.serve(version, params_to_chunks(params))
        self._version.set({"version": version, "url": self._server.url(version)})

    def close(self) -> None:
        self._server.close()


class WeightSource(Background):
    """Publishes every `interval` steps; counts versions; says which the actors can use."""

    def __init__(self, transport: Transport, interval: int, version: int = 0):
        super().__init__("tandem-weight-publisher")
        self.interval = interval
        self._transport = transport
        self._current = self._visible = version
        self._pending: tuple[int, Any, float] | None = None
        self._sending = False
        self._cond = threading.Condition()
        self.lag_s = 0.0  # handover to visible, of the last version sent
        self.skipped = 0  # versions superseded before they were sent

    @property
    def current(self) -> int:
        return self._current

    @property
    def visible(self) -> int:
        return self._visible

    def due(self, step: int) -> bool:
        """Whether `step` ends a version."""
        return step % self.interval == 0

    def publish(self, params: Any, *, new_version: bool = True) -> int:
        """Hands `params` over as the next version (or, at a session's start, as the current
        one again) and returns its number; raises if an earlier send failed."""
        self.raise_if_failed()
        with self._cond:
            self._current += new_version
            self.skipped += self._pending is not None
            self._pending = (self._current, params, time.perf_counter())
            self._cond.notify_all()
        return self._current

    def wait(self) -> None:
        """Until the last version handed over is visible to the actors."""
        with self._cond:
            self._cond.wait_for(lambda: self.failed or not (self._pending or self._sending))
        self.raise_if_failed()

    def stop(self, timeout_s: float = 10.0) -> bool:
        """Sends the version waiting, if any, then stops publishing."""
        stopped = super().stop(timeout_s)
        self._transport.close()
        return stopped

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending or self._stopping.is_set())
                if self._pending is None:
                    return
                (version, params, handed), self._pending, self._sending = self._pending, None, True
            self._transport.send(version, params)  # a failure ends the thread: `_failed` wakes waiters
            with self._cond:
                self._visible, self.lag_s = version, time.perf_counter() - handed
                self._sending = False
                self._cond.notify_all()

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def _failed(self, error: BaseException) -> None:
        with self._cond:
            self._cond.notify_all()
