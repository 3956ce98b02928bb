"""Weight publishing: the learner publishes (version, params); actors pull the latest.

Params cross Dask as a NumPy pytree (JAX arrays lose their sharding when pickled),
scattered once per version and named by a `distributed.Variable`. Actors fetch a
version at most once (the Variable's future key tells them whether it changed);
replicas are not broadcast up front, since the Active Memory Manager would drop them.
"""

from __future__ import annotations

from typing import Any

from distributed import Client, Variable


class WeightPublisher:
    def __init__(self, name: str, client: Client):
        self._client = client
        self._variable = Variable(name, client=client)
        self._version = Variable(f"{name}-version", client=client)
        self._future = None

    def publish(self, version: int, params: Any) -> None:
        # In a list: scatter would make a future per entry of a bare dict.
        [future] = self._client.scatter([{"version": version, "params": params}], hash=False)
        self._variable.set(future)
        self._version.set(version)  # after the params: a reader never sees a version early
        self._future = future  # the previous version is released once replaced


class WeightSubscriber:
    def __init__(self, name: str, client: Client):
        self._variable = Variable(name, client=client)
        self._version = Variable(f"{name}-version", client=client)
        self._key = None
        self._latest: dict | None = None

    def latest(self, timeout: float | None = None) -> tuple[int, Any]:
        """(version, params) last published; fetches params only when the version changed."""
        future = self._variable.get(timeout=timeout)
        if future.key != self._key:
            self._latest, self._key = future.result(), future.key
        return self._latest["version"], self._latest["params"]

    def version(self) -> int:
        """The version last published, without fetching its params."""
        return self._version.get()
