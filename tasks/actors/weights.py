"""The actors' end of weight publishing (`tasks.runtime.session.weights`): a thread that follows the
published version and fetches each new one from the learner's weight server.

One follower per actor process and session: the version is polled (one small scheduler
round trip every `poll_s`), never asked per group, and a version's bytes are fetched once.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
import urllib.error
import urllib.request
from typing import Any, Callable

from distributed import Client, Variable

from learner.serialization import params_from_bytes
from tasks.background import Background
from tasks.buffer.channels import Channels

FETCH_TIMEOUT_S = 60.0  # one version's bytes from the learner
VERSION_TIMEOUT_S = 30.0  # one wait on the scheduler for the published version
POLL_S = 0.05
# A poll waits at most VERSION_TIMEOUT_S on the scheduler and its fetch's socket at most
# FETCH_TIMEOUT_S at a time: one that has not returned after this long is stuck, and an
# actor waiting for a version would wait for ever, its groups in flight, saying nothing
# (`raise_if_stuck`).
STUCK_S = 120.0


class WeightFollower(Background):
    """Calls `on_new(version, params)` (host NumPy params) for each new version published."""

    def __init__(self, channels: Channels, client: Client, on_new: Callable[[int, Any], None], poll_s: float = POLL_S):
        super().__init__("tandem-weight-follower")
        self._variable = Variable(channels.weights_version, client=client)
        self._on_new, self._poll_s = on_new, poll_s
        self._first = threading.Event()
        self._polled = time.monotonic()  # when the last poll returned (or the follower began)
        self.latest: tuple[int, Any] | None = None  # (version, params) last handed on

    def wait_first(self, timeout_s: float = 300.0) -> tuple[int, Any]:
        """The first version, once it is loaded; raises if the follower failed or timed out."""
        while not self._first.wait(0.2):
            self.raise_if_failed()
            timeout_s -= 0.2
            if timeout_s <= 0:
                raise TimeoutError("no weights were published")
        return self.latest

    def raise_if_stuck(self, stuck_s: float = STUCK_S) -> None:
        """`raise_if_failed`, and raises too if a poll has not returned within `stuck_s`,
        naming where its thread waits."""
        self.raise_if_failed()
        waited = time.monotonic() - self._polled
        if waited > stuck_s and self._thread.is_alive():
            frame = sys._current_frames().get(self._thread.ident)
            calls = traceback.extract_stack(frame) if frame is not None else []
            ours = next((i for i, call in enumerate(calls) if call.name == "_run"), 0)
            where = " -> ".join(f"{call.name} ({call.filename.rsplit('/', 1)[-1]}:{call.lineno})"
                                for call in calls[ours:]) or "(it has just ended)"
            version = self.latest[0] if self.latest else None
            raise RuntimeError(f"{self.name}: a poll for new weights has not returned in {waited:.0f}s "
                               f"(latest version loaded: {version}); its thread waits in {where}")

    def _run(self) -> None:
        while not self._stopping.is_set():
            published = self._variable.get(timeout=VERSION_TIMEOUT_S)
            data = None
            if self.latest is None or published["version"] != self.latest[0]:
                data = _fetch(published["url"])  # None: superseded meanwhile; the next poll finds its successor
            if data is not None:
                params = params_from_bytes(data)
                self._on_new(published["version"], params)
                self.latest = (published["version"], params)
                self._first.set()
            self._polled = time.monotonic()
            self._stopping.wait(self._poll_s)


def _fetch(url: str) -> bytes | None:
    try:
        with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT_S) as response:
            return response.read()
    except urllib.error.HTTPError as e:
        if e.code == 404:  # the server keeps only the latest version
            return None
        raise ConnectionError(f"cannot fetch weights from the learner at {url}: {e}") from e
    except urllib.error.URLError as e:
        raise ConnectionError(f"cannot fetch weights from the learner at {url}: {e}") from e
