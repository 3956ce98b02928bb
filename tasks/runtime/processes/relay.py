"""The learner process's events (logs, versions, progress, its result) to its Prefect task,
over a one-way pipe whose reader learns when the learner is gone.

Not a `multiprocessing.Queue`: its parent keeps the pipe's write end open, so a learner
killed in the middle of a message (a large one takes several writes) leaves the parent
in a read that never ends. Here the task closes its copy of the write end once the
learner has started, so a dead learner is an end of file, mid-message or not.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.util
import queue
import threading
from multiprocessing.connection import Connection
from typing import Any

Event = tuple[str, Any]  # (kind, payload)


class EventReader:
    """The task's end; `writer` is the learner's (an argument of the spawned process)."""

    def __init__(self):
        self._connection, writer_end = multiprocessing.get_context("spawn").Pipe(duplex=False)
        self.writer = EventWriter(writer_end)
        self.gone = False  # the learner's end is closed: it exited, or died

    def started(self) -> None:
        """The learner holds its own copy of the write end now: once it exits, reads end."""
        self.writer.connection.close()

    def get(self, timeout_s: float) -> Event | None:
        """The next event; None if none came within `timeout_s`, or if the learner is gone
        (`gone`), even in the middle of a message."""
        if self.gone or not self._connection.poll(timeout_s):
            return None
        try:
            return self._connection.recv()
        except (EOFError, OSError):  # OSError: "got end of file during message"
            self.gone = True
            return None

    def close(self) -> None:
        self._connection.close()


class EventWriter:
    """The learner's end, used as a `multiprocessing.Queue` is (`put`, `close`, `join_thread`).
    `put` never blocks the learner: a thread writes the events, in order, while the task may
    be busy with Prefect's API. Pickled into the spawned learner, it starts afresh there."""

    def __init__(self, connection: Connection):
        self.connection = connection
        self._pending: queue.SimpleQueue[Event | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def __reduce__(self):
        return EventWriter, (self.connection,)

    def put(self, event: Event) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._write, name="tandem-events", daemon=True)
                self._thread.start()
                # A spawned process ends without atexit handlers; multiprocessing's finalizers run.
                multiprocessing.util.Finalize(self, self._flush, exitpriority=10)
        self._pending.put(event)

    def close(self) -> None:
        """No more events: the thread ends once it has written those pending."""
        self._pending.put(None)

    def join_thread(self, timeout_s: float = 10.0) -> None:
        """Waits, up to `timeout_s` (the task may be gone), for the pending events to be written."""
        if self._thread is not None:
            self._thread.join(timeout_s)
        if self._thread is None or not self._thread.is_alive():
            self.connection.close()

    def _flush(self) -> None:
        self.close()
        self.join_thread()

    def _write(self) -> None:
        while (event := self._pending.get()) is not None:
            try:
                self.connection.send(event)
            except OSError:  # the task is gone: nobody is left to tell
                return


class LogForwarder(logging.Handler):
    """Sends the warnings of the `tasks.*` loggers (of parts that have no log of their own,
    such as a background thread that did not stop) to the task's log."""

    def __init__(self, writer: EventWriter):
        super().__init__(logging.WARNING)
        self._writer = writer

    def emit(self, record: logging.LogRecord) -> None:
        level = "error" if record.levelno >= logging.ERROR else "warning"
        self._writer.put(("log", (level, self.format(record), False)))

    def install(self) -> None:
        logger = logging.getLogger("tasks")
        logger.propagate = False  # to the task's log only, not also to a handler JAX's absl installed
        logger.addHandler(self)
