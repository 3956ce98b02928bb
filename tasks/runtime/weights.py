"""Weight publishing: the learner publishes (version, params); actors pull the latest.

Params cross Dask as a NumPy pytree (JAX arrays lose their sharding when pickled),
scattered once per version and named by a `distributed.Variable`. Actors fetch a
version at most once per worker process (the Variable's future key tells them whether it
changed); replicas are not broadcast up front, since the Active Memory Manager would
drop them.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from distributed import Client, Variable


class WeightPublisher:
    """Publishes from a thread of its own, so the learner does not wait on Dask.

    The learner hands over host params and goes on training while the scatter and the two
    Variable updates (scheduler round trips, slow when the scheduler is busy) run here.
    Only the newest version waiting is sent: actors want the latest, and a version
    superseded before it left would never be used.
    """

    def __init__(self, name: str, client: Client, on_sent: Callable[[int], None] = lambda version: None):
        self._client, self._on_sent = client, on_sent  # on_sent(version): called once it is visible
        self._variable = Variable(name, client=client)
        self._version = Variable(f"{name}-version", client=client)
        self._future = None
        self._pending: tuple[int, Any, float] | None = None
        self._sending = False
        self._closed = False
        self._error: BaseException | None = None
        self.lag_s = 0.0  # handover to visible, of the last version sent
        self.skipped = 0  # versions superseded before they were sent
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._send_loop, name="weight-publisher", daemon=True)
        self._thread.start()

    def publish(self, version: int, params: Any) -> None:
        """Hands `params` of `version` over; returns at once (raises a failed earlier send)."""
        with self._cond:
            self._raise_failed()
            self.skipped += self._pending is not None
            self._pending = (version, params, time.perf_counter())
            self._cond.notify_all()

    def wait(self) -> None:
        """Until the last version handed over is visible to the actors."""
        with self._cond:
            self._cond.wait_for(lambda: self._error or not (self._pending or self._sending))
            self._raise_failed()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()

    def _raise_failed(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"publishing weights failed: {self._error!r}") from self._error

    def _send_loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending or self._closed)
                if self._pending is None:
                    return
                (version, params, handed), self._pending, self._sending = self._pending, None, True
            try:
                self._send(version, params)
            except BaseException as error:  # surfaced to the learner at its next call
                with self._cond:
                    self._error, self._sending = error, False
                    self._cond.notify_all()
                return
            with self._cond:
                self.lag_s, self._sending = time.perf_counter() - handed, False
                self._cond.notify_all()

    def _send(self, version: int, params: Any) -> None:
        # In a list: scatter would make a future per entry of a bare dict.
        [future] = self._client.scatter([{"version": version, "params": params}], hash=False)
        self._variable.set(future)
        self._version.set(version)  # after the params: a reader never sees a version early
        self._future = future  # the previous version is released once replaced
        self._on_sent(version)
