"""Ctrl-C in the process that runs the flow (`tandem run`): the learner trains on to its
next version (at most `sync.interval` steps), checkpoints it and stops, and the run ends
cleanly; a second Ctrl-C stops the learner at once, without that checkpoint.

A terminal sends SIGINT to every process of its foreground group: the CLI, the learner
process and the local cluster's workers. Only the CLI acts on it. The processes it starts
ignore SIGINT (an ignored signal stays ignored across exec, and Python leaves it so), so
the actors keep playing while the learner finishes its version.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator


class Interrupt:
    """Counts the Ctrl-Cs of this process; the learner task reads it."""

    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()

    def request(self) -> int:
        """One Ctrl-C; returns how many so far."""
        with self._lock:
            self.count += 1
            return self.count

    def is_set(self) -> bool:
        return self.count > 0

    @property
    def now(self) -> bool:
        """Asked twice: stop at once."""
        return self.count > 1

    def clear(self) -> None:
        with self._lock:
            self.count = 0


INTERRUPT = Interrupt()


@contextlib.contextmanager
def ignoring_sigint() -> Iterator[None]:
    """Processes started inside ignore SIGINT for good. So does this one, for as long as
    the block runs (a Ctrl-C then is lost): keep the block to the starting of processes.
    Only the main thread can set a handler; elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
