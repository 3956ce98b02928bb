"""The actors' end of weight publishing (`tasks.runtime.weights`): the latest published
(version, params), fetched from the learner's weight server when the version changes."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from typing import Any, Callable

from distributed import Client, Variable

from learner.serialization import params_from_bytes
from tasks.buffer.channels import Channels

FETCH_TIMEOUT_S = 60.0  # one version's bytes from the learner


class WeightSubscriber:
    """The latest published weights, as `load(params)` makes them (e.g. on the device).

    Actors that share a worker process share one copy per version: it is fetched and
    loaded once, by whichever asks first.
    """

    _shared: dict[str, tuple[int, Any]] = {}  # channel -> (version, loaded params)
    _lock = threading.Lock()

    def __init__(self, channels: Channels, client: Client, load: Callable[[Any], Any] = lambda params: params):
        self._name, self._load = channels.weights_version, load
        self._variable = Variable(channels.weights_version, client=client)

    def latest(self, timeout: float | None = None) -> tuple[int, Any]:
        """(version, params) last published; fetched only when the version changed."""
        published = self._variable.get(timeout=timeout)
        with self._lock:  # one fetch per version per process; the others wait for it
            cached = self._shared.get(self._name)
            if cached is None or cached[0] != published["version"]:
                params = self._load(params_from_bytes(_fetch(published["url"])))
                cached = self._shared[self._name] = (published["version"], params)
                while len(self._shared) > 4:  # sessions past, on a long-lived worker
                    self._shared.pop(next(iter(self._shared)))
        return cached

    def version(self) -> int:
        """The version last published, without fetching its params."""
        return self._variable.get()["version"]


def _fetch(url: str) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT_S) as response:
            return response.read()
    except urllib.error.URLError as e:
        raise ConnectionError(f"cannot fetch weights from the learner at {url}: {e}") from e
