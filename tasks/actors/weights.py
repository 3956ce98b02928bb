"""The actors' end of weight publishing (`tasks.runtime.weights`): the latest published (version, params)."""

from __future__ import annotations

import threading
from typing import Any, Callable

from distributed import Client, Variable

from tasks.buffer.channels import Channels


class WeightSubscriber:
    """The latest published weights, as `load(params)` makes them (e.g. on the device).

    Actors that share a worker process share one copy per version: it is fetched and
    loaded once, by whichever asks first.
    """

    _shared: dict[str, tuple[str, int, Any]] = {}  # channel -> (future key, version, loaded)
    _lock = threading.Lock()

    def __init__(self, channels: Channels, client: Client, load: Callable[[Any], Any] = lambda params: params):
        self._name, self._load = channels.weights, load
        self._variable = Variable(channels.weights, client=client)
        self._version = Variable(channels.weights_version, client=client)

    def latest(self, timeout: float | None = None) -> tuple[int, Any]:
        """(version, params) last published; fetched only when the version changed."""
        future = self._variable.get(timeout=timeout)
        with self._lock:  # one fetch per version per process; the others wait for it
            cached = self._shared.get(self._name)
            if cached is None or cached[0] != future.key:
                published = future.result()
                cached = (future.key, published["version"], self._load(published["params"]))
                self._shared.pop(self._name, None)
                self._shared[self._name] = cached
                while len(self._shared) > 4:  # sessions past, on a long-lived worker
                    self._shared.pop(next(iter(self._shared)))
        return cached[1], cached[2]

    def version(self) -> int:
        """The version last published, without fetching its params."""
        return self._version.get()
