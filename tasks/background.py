"""One lifecycle for the learner session's background threads (the buffer's exchange with
Dask, the weight publisher): started and stopped the same way, and an error in one
surfaced to its owner the same way, at the owner's next call, instead of dying silently.
"""

from __future__ import annotations

import logging
import threading

log = logging.getLogger(__name__)  # in the learner process, relayed to its task's log


class Background:
    """A daemon thread running `self._run()` until `stop()`.

    Subclasses implement `_run` (which returns once `self._stopping` is set) and may
    override `_wake` (to cut a wait short when stopping) and `_failed` (to notify
    threads waiting on them).
    """

    def __init__(self, name: str):
        self.name = name
        self._stopping = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)

    def start(self):
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 10.0) -> bool:
        """Asks the thread to stop and waits up to `timeout_s`; False, and a warning, if it
        is still running (hung on a scheduler or worker that does not answer: it is a
        daemon, and dies with the process)."""
        self._stopping.set()
        self._wake()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                log.warning(f"{self.name} did not stop within {timeout_s:g}s (waiting on a Dask scheduler "
                            "or worker that does not answer?); given up on")
        return not self._thread.is_alive()

    def raise_if_failed(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"{self.name} failed: {type(self._error).__name__}: {self._error}") from self._error

    @property
    def failed(self) -> bool:
        return self._error is not None

    def _main(self) -> None:
        try:
            self._run()
        except BaseException as error:  # surfaced to the owner by raise_if_failed
            if not self._stopping.is_set():
                self._error = error
                self._failed(error)

    def _run(self) -> None:
        raise NotImplementedError

    def _wake(self) -> None:
        """Cuts short whatever the thread waits on (called by `stop`)."""

    def _failed(self, error: BaseException) -> None:
        """Called in the thread when `_run` raised."""
