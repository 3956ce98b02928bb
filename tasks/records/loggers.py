"""Where step records go: sinks handed a typed `StepRecord` each (Acme's loggers), fanned
out by `Loggers`. A sink only reads the record."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from typing import Callable, Iterator, Protocol

from tasks.records.step import StepRecord
from tasks.records.warnings import entropy_collapsing, filtered_too_often


class Logger(Protocol):
    def write(self, record: StepRecord) -> None: ...


class Loggers:
    """Writes each record to every sink, in order; `close` closes those that need it."""

    def __init__(self, *sinks: Logger):
        self.sinks = sinks

    def write(self, record: StepRecord) -> None:
        for sink in self.sinks:
            sink.write(record)

    def close(self) -> None:
        for sink in self.sinks:
            if hasattr(sink, "close"):
                sink.close()


@dataclasses.dataclass(frozen=True)
class Progress:
    """What the terminal and Prefect show of a learner step (picklable: it crosses from
    the learner process to the learner task)."""

    step: int
    version: int
    reward_mean: float
    success_rate: float | None
    buffered: int  # groups in the buffer (queued or prefetched; a queue item may bundle several)
    learner_busy: float
    loss: float
    entropy: float | None = None  # of the trained tokens; None if the loss reports none
    filtered_share: float | None = None  # None until a group finished

    @classmethod
    def of(cls, r: StepRecord) -> "Progress":
        return cls(step=r.step, version=r.version, reward_mean=r.reward_mean, success_rate=r.success_rate,
                   buffered=r.buffer_depth, learner_busy=r.learner_busy, loss=r.train.get("loss", float("nan")),
                   entropy=r.train.get("entropy"), filtered_share=r.filtered_share)

    def collapse_signs(self) -> list[tuple[str, bool]]:
        """The signs of entropy collapse, as (text, past its warning level) pairs: one
        wording for the log line and the live display, which marks them in its own way."""
        signs = []
        if self.entropy is not None:
            signs.append((f"entropy {self.entropy:.2g}", entropy_collapsing(self.entropy)))
        if self.filtered_share is not None:
            signs.append((f"filtered {self.filtered_share:.0%}", filtered_too_often(self.filtered_share)))
        return signs

    def line(self) -> str:
        """One line; a `!` marks a sign past its warning level."""
        success = f" success {self.success_rate:.0%}" if self.success_rate is not None else ""
        signs = "".join(f"{text}{'!' if warned else ''} | " for text, warned in self.collapse_signs())
        return (f"step {self.step} version {self.version} | reward {self.reward_mean:.3f}{success} | {signs}"
                f"buffered {self.buffered} | learner busy {self.learner_busy:.0%} | loss {self.loss:.4f}")


class ConsoleLog:
    """A progress line (`info(line)`) at most every `every_s` seconds: the learner task's
    log in Prefect (the terminal shows the live display instead: `info` logs it as `ROUTINE`)."""

    def __init__(self, info: Callable[[str], None], every_s: float = 10.0):
        self.info, self.every_s = info, every_s
        self._last = 0.0

    def write(self, record: StepRecord) -> None:
        now = time.perf_counter()
        if now - self._last >= self.every_s:
            self._last = now
            self.info(Progress.of(record).line())


class ProgressLog:
    """Hands a `Progress` to `progress` after every step: the Prefect progress artifact and
    the terminal's live display."""

    def __init__(self, progress: Callable[[Progress], None]):
        self.progress = progress

    def write(self, record: StepRecord) -> None:
        self.progress(Progress.of(record))


class ProgressFeed:
    """The learner's progress inside the process running the flow: the learner task
    publishes each step it relays, and `tandem run`'s live display subscribes."""

    def __init__(self) -> None:
        self._listeners: list[Callable[[Progress], None]] = []

    def publish(self, progress: Progress) -> None:
        for listener in list(self._listeners):
            listener(progress)

    @contextlib.contextmanager
    def subscribed(self, listener: Callable[[Progress], None]) -> Iterator[None]:
        self._listeners.append(listener)
        try:
            yield
        finally:
            self._listeners.remove(listener)


PROGRESS_FEED = ProgressFeed()

# The `extra` of a log record the terminal hides below WARNING (`flows.console.Routine`):
# what the live display already shows, or what every run logs (a progress line, an eval's scores).
ROUTINE = {"tandem_routine": True}


def is_routine(record: logging.LogRecord) -> bool:
    return getattr(record, "tandem_routine", False)
