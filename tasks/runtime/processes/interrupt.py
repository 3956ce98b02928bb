"""Stopping a run from outside: Ctrl-C and SIGTERM to the process that runs the flow
(`tandem run`). The learner trains on to its next version (at most `sync.interval` steps),
checkpoints it and stops, and the run ends cleanly, its flow run Cancelled; a second Ctrl-C
stops the learner at once, without that checkpoint. Before the learner's first step there
is nothing to checkpoint, so a stop then is at once (`tasks.runtime.processes.task`).

SIGTERM (what Slurm, Kubernetes and `timeout` send) asks what a first Ctrl-C asks, however
often it comes: what ends a run sooner is SIGKILL, which no process of the run outlives by
more than a few seconds (README, "Faults").

A terminal sends SIGINT to every process of its foreground group: the CLI, the learner
process and the local cluster's workers; a Slurm job step sends SIGTERM to every process
of the step. Only the CLI acts on SIGINT, and the learner process on SIGTERM as the CLI
does (`tasks.runtime.processes.task`). The processes the CLI starts have both blocked: a thread
passes its signal mask on to the threads and processes it starts, and exec keeps it. So
the actors play on while the learner finishes its version, and stop when it stops them
(Dask's nanny ends a worker with SIGKILL, never SIGTERM). The CLI blocks them only while
it starts processes (`blocking`): a signal meanwhile waits, or another of its threads takes
it and its handler runs in the main thread; none is lost (an ignored one would be, for the
whole of the cluster's start).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from multiprocessing import resource_tracker
from typing import Callable, Iterator


class Interrupt:
    """The stop requests of this process (Ctrl-C, SIGTERM); the learner task reads it."""

    def __init__(self) -> None:
        self.count = 0
        self.signum: int | None = None  # the first request's signal: `tandem run` exits 128 + it
        self._lock = threading.Lock()

    def request(self, signum: int = signal.SIGINT) -> int:
        """One Ctrl-C, or a SIGTERM (which never asks for more than the first does); returns
        how many so far."""
        with self._lock:
            self.signum = self.signum or signum
            if signum == signal.SIGINT or self.count == 0:
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
            self.count, self.signum = 0, None


INTERRUPT = Interrupt()
_handler: Callable | None = None  # `tandem run`'s handler of SIGINT and SIGTERM, while it runs


def signal_name(signum: int | None) -> str:
    """As the terminal says it: "Ctrl-C", "SIGTERM"."""
    return "Ctrl-C" if signum in (None, signal.SIGINT) else signal.Signals(signum).name


@contextlib.contextmanager
def handling(handler: Callable) -> Iterator[None]:
    """Gives SIGINT and SIGTERM to `handler` (in the main thread) while the block runs; the
    training flow takes SIGTERM back from Prefect for it (`reclaim_sigterm`)."""
    global _handler
    previous = {signum: signal.signal(signum, handler) for signum in (signal.SIGINT, signal.SIGTERM)}
    _handler = handler
    try:
        yield
    finally:
        _handler = None
        for signum, restored in previous.items():
            signal.signal(signum, restored)


def reclaim_sigterm() -> None:
    """Gives SIGTERM back to `tandem run`'s handler, where it runs this flow: Prefect's flow
    engine gives it one of its own, which crashes the flow run and ends the process at once,
    leaving its learner process to train on. A deployment's flow run keeps Prefect's: its
    runner cancels a flow run with SIGTERM."""
    if _handler is not None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _handler)


@contextlib.contextmanager
def blocking(*signums: int) -> Iterator[None]:
    """Blocks `signums` in this thread while the block runs: the threads and processes it
    starts keep them blocked for good. One sent meanwhile is not lost: it waits for the end
    of the block, or another thread takes it and its handler runs in the main thread then.
    Keep the block to the starting of processes."""
    # multiprocessing's resource tracker, the first time it starts, unblocks SIGINT and
    # SIGTERM in the thread that starts it (its fix of CPython's bpo-33613): started before.
    resource_tracker.ensure_running()
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, signums)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


@contextlib.contextmanager
def deferred(signum: int) -> Iterator[None]:
    """Holds `signum` back from its handler while the block runs, and handles it as the block
    ends. For a block that an exception midway would leave with nothing to undo it: a
    KeyboardInterrupt inside `LocalCluster(...)` leaves its processes to Dask's exit hook,
    which fails on workers already closing. Blocking the signal would not do: a thread that
    does not block it takes it, and Python raises in the main thread all the same. Handlers
    belong to the main thread: elsewhere the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = signal.signal(signum, lambda received, _: caught.append(received))
    try:
        yield
    finally:
        signal.signal(signum, previous)
    if caught:
        signal.raise_signal(signum)
