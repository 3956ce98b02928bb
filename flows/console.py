"""What `tandem run` shows in the terminal: one live progress display, and the log records
that are not routine (everything at INFO with `--verbose`).

The display is fed by the learner task (`tasks.records.loggers.PROGRESS_FEED`), which
relays every step the learner process reports. The Prefect UI keeps the full logs: only
the terminal's handler is replaced, not Prefect's API handlers.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

from rich.console import Console
from rich.logging import RichHandler
from rich.progress import BarColumn, Progress as Bar, TextColumn
from rich.table import Column

from tasks.records.loggers import Progress, is_routine
from tasks.runtime.processes.interrupt import INTERRUPT, Interrupt, signal_name

CHATTY = "distributed"  # INFO on every connection, worker and shutdown step: WARNING unless verbose
INTERNAL = "prefect._internal"  # Prefect's services (its event client's worker, say): ERROR and up


class Routine(logging.Filter):
    """Hides, below WARNING, what the live display replaces and what every run logs: each
    task's "Finished in state Completed()" (one per version), the learner's progress lines,
    each version's eval scores (the run's end names the best), and a Ctrl-C's "Cancelled" (the CLI says where the run stopped). What is left is what a
    user wants to know: a resume, a retry, why it stopped."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            return True
        message = record.getMessage()
        return not (is_routine(record)
                    or message.startswith(("Finished in state Completed", "Finished in state Cancelled")))


class OnceAndShort(logging.Filter):
    """A failure reaches the terminal once, in a few lines (the CLI's last words say why the
    run failed): Prefect's engine's records of a task or flow run failing are left to the
    log file and the UI, and no record prints its traceback here."""

    ENGINE = ("prefect.task_runs", "prefect.flow_runs")
    FAILING = ("Task run failed with exception", "Finished in state Failed", "Encountered exception during execution")

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name in self.ENGINE and record.getMessage().startswith(self.FAILING):
            return False
        # The same record goes on to no other handler: ours is the root's last (`terminal_logging`).
        record.exc_info, record.exc_text, record.stack_info = None, None, None
        return True


class ServerUnreachable(logging.Filter):
    """While the Prefect server does not answer (killed, restarting), Prefect's event client
    logs a warning per attempt and an error per event it gives up on, each with the whole
    event: the terminal shows one line for such a spell (records less than `quiet_s` apart),
    the log file keeps them all."""

    NOISE = (("prefect.events.clients", "Unable to connect to"),
             ("prefect._internal.concurrency", "Service 'EventsWorker' failed to process item"))

    def __init__(self, quiet_s: float = 60.0, clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self.quiet_s, self.clock, self._last = quiet_s, clock, None

    def filter(self, record: logging.LogRecord) -> bool:
        if not any(record.name.startswith(name) and record.getMessage().startswith(text) for name, text in self.NOISE):
            return True
        now, last = self.clock(), self._last
        self._last = now
        if last is not None and now - last < self.quiet_s:
            return False
        record.msg, record.args = ("the Prefect server does not answer: the UI may miss task-run states and "
                                   "events from now until it does (training goes on; tandem.log has each)"), ()
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


@contextlib.contextmanager
def terminal_logging(console: Console, verbose: bool, log_file: Path | None = None) -> Iterator[None]:
    """Routes log records to the terminal through `console`, so that they print above the
    live display: those `Routine` lets through, or all at INFO and up if `verbose`; and
    all, with their tracebacks, to `log_file` if given."""
    from prefect.logging.configuration import ensure_logging_setup
    from prefect.logging.formatters import PrefectFormatter
    from prefect.logging.handlers import PrefectConsoleHandler

    ensure_logging_setup()  # Prefect's own first, else it would be set up over ours
    # The local cluster's workers and the learner process read this when they start.
    dask_env = "DASK_LOGGING__DISTRIBUTED" not in os.environ
    os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "info" if verbose else "warning")
    root, chatty = logging.getLogger(), logging.getLogger(CHATTY)
    # Prefect's console handler, and the plain one `logging.basicConfig` leaves (absl calls it
    # when it logs before any handler is set): each would print every record a second time.
    replaced = [h for h in root.handlers if isinstance(h, PrefectConsoleHandler)
                or (type(h) is logging.StreamHandler and h.stream in (sys.stderr, sys.stdout))]
    chatty_level = chatty.level
    handler, prefix = _handler(console)
    handler.setFormatter(PrefectFormatter(format=f"{prefix}%(name)s - %(message)s",
                                          flow_run_fmt=f"{prefix}Flow run %(flow_run_name)r - %(message)s",
                                          task_run_fmt=f"{prefix}Task run %(task_run_name)r - %(message)s",
                                          datefmt="%H:%M:%S"))
    if not verbose:
        handler.addFilter(Routine())
        handler.addFilter(OnceAndShort())
        handler.addFilter(ServerUnreachable())
        chatty.setLevel(logging.WARNING)
    for h in replaced:
        root.removeHandler(h)
    # Prefect's internal logger prints on its own handler: here, through ours and to the file.
    internal = logging.getLogger(INTERNAL)
    internal_handlers, internal_propagate = list(internal.handlers), internal.propagate
    for h in internal_handlers:
        internal.removeHandler(h)
    internal.propagate = True
    to_file = _file_handler(log_file) if log_file is not None else None
    if to_file is not None:
        root.addHandler(to_file)  # before the terminal's, whose filter drops tracebacks
    root.addHandler(handler)
    logging.captureWarnings(True)  # a library's warnings.warn, printed above the display too
    try:
        yield
    finally:
        logging.captureWarnings(False)
        root.removeHandler(handler)
        if to_file is not None:
            root.removeHandler(to_file)
            to_file.close()
        for h in replaced:
            root.addHandler(h)
        internal.propagate = internal_propagate
        for h in internal_handlers:
            internal.addHandler(h)
        chatty.setLevel(chatty_level)
        if dask_env:
            del os.environ["DASK_LOGGING__DISTRIBUTED"]


def _file_handler(path: Path) -> logging.Handler:
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setLevel(logging.INFO)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    return handler


def _handler(console: Console) -> tuple[logging.Handler, str]:
    """Rich's handler on a terminal (it prints above the live display); elsewhere plain
    lines, as Prefect's are, with no padding to the console's width. And the prefix its
    format needs."""
    if console.is_terminal:
        return RichHandler(console=console, show_path=False, markup=False, log_time_format="%H:%M:%S"), ""
    return logging.StreamHandler(console.file), "%(asctime)s | %(levelname)-7s | "


class LiveDisplay:
    """The learner's progress in one live line: step of total, a bar, version, success,
    reward, entropy and the filtered share (in red, with a `!`, past their warning levels:
    entropy collapse coming), groups buffered, the learner's busy time and an ETA. Where
    the output is not a terminal (a pipe, a CI log), a plain line every `every_s` seconds
    instead, marked by the `!` alone."""

    def __init__(self, console: Console, total_steps: int, stop_at_success: float | None,
                 every_s: float = 15.0, clock: Callable[[], float] = time.monotonic,
                 interrupt: Interrupt = INTERRUPT):
        """`interrupt`: the stop requests it shows (this process's signals)."""
        self.console, self.total, self.target, self.every_s = console, total_steps, stop_at_success, every_s
        self.clock, self.interrupt = clock, interrupt
        self.last: Progress | None = None
        self._times: collections.deque[tuple[float, int]] = collections.deque(maxlen=64)
        self._printed: float | None = None  # when the last plain line was printed
        # The step and the bar keep their width; a status longer than the terminal is cut at its end.
        step_width = len(f"step {total_steps}/{total_steps}")
        self._bar = Bar(TextColumn("step {task.completed:.0f}/{task.total:.0f}",
                                   table_column=Column(no_wrap=True, min_width=step_width)),
                        BarColumn(bar_width=24, table_column=Column(no_wrap=True, min_width=24)),
                        TextColumn("{task.description}", table_column=Column(no_wrap=True, overflow="ellipsis", ratio=1)),
                        console=console, refresh_per_second=4, disable=not console.is_terminal)
        self._task = self._bar.add_task("starting: Dask actors, the learner process, its first compile",
                                        total=total_steps)

    def __enter__(self) -> "LiveDisplay":
        self._bar.start()
        return self

    def __exit__(self, *exc) -> None:
        self.refresh()
        self._bar.stop()

    def update(self, progress: Progress) -> None:
        self.last, now = progress, self.clock()
        self._times.append((now, progress.step))
        self.refresh()
        if not self.console.is_terminal and (self._printed is None or now - self._printed >= self.every_s):
            self._printed = now
            self.console.print(f"step {progress.step}/{self.total} {self.status()}", highlight=False)

    def refresh(self) -> None:
        """Redraws the line (also to show a Ctrl-C before the next step arrives)."""
        step = self.last.step if self.last else 0
        self._bar.update(self._task, completed=step, description=self.status())

    def status(self) -> str:
        p = self.last
        if p is None:
            return "starting: Dask actors, the learner process, its first compile"
        success = f"success {p.success_rate:.0%} | " if p.success_rate is not None else ""
        if self.interrupt.is_set():  # what matters now, short enough to stay whole on a terminal
            return f"version {p.version} | {success}{self._interrupt_note()}"
        signs = "".join(f"{_warned(text) if warned else text} | " for text, warned in p.collapse_signs())
        return (f"version {p.version} | {success}reward {p.reward_mean:.2f} | {signs}buffered {p.buffered} | "
                f"busy {p.learner_busy:.0%} | {self._eta()}")

    def _eta(self) -> str:
        """From the pace of the last steps; an upper bound where a success target may stop it earlier."""
        (t0, s0), (t1, s1) = self._times[0], self._times[-1]
        if s1 <= s0:
            return "ETA -"
        seconds = (self.total - s1) * (t1 - t0) / (s1 - s0)
        bound = "≤ " if self.target is not None else ""
        return f"ETA {bound}{int(seconds // 60)}:{int(seconds % 60):02d}"

    def _interrupt_note(self) -> str:
        if self.interrupt.now:
            return "Ctrl-C twice: stopping at once"
        return f"{signal_name(self.interrupt.signum)}: stopping at the next version (Ctrl-C again: at once)"


def _warned(text: str) -> str:
    """Rich markup of a sign past its warning level; printed off a terminal, only the `!` shows."""
    return f"[bold red]{text}![/]"
