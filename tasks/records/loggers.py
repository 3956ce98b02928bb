"""Where step records go: sinks handed a typed `StepRecord` each (Acme's loggers), fanned
out by `Loggers`. A sink only reads the record."""

from __future__ import annotations

import time
from typing import Callable, Protocol

from tasks.records.step import StepRecord


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


class ConsoleLog:
    """A progress line (`info(line)`) at most every `every_s` seconds."""

    def __init__(self, info: Callable[[str], None], every_s: float = 2.0):
        self.info, self.every_s = info, every_s
        self._last = 0.0

    def write(self, record: StepRecord) -> None:
        now = time.perf_counter()
        if now - self._last >= self.every_s:
            self._last = now
            self.info(progress_line(record))


class ProgressLog:
    """Hands (step, version) to `progress` after every step: the Prefect progress artifact."""

    def __init__(self, progress: Callable[[int, int], None]):
        self.progress = progress

    def write(self, record: StepRecord) -> None:
        self.progress(record.step, record.version)


def progress_line(r: StepRecord) -> str:
    success = f" success {r.success_rate:.0%}" if r.success_rate is not None else ""
    return (f"step {r.step} version {r.version} | reward {r.reward_mean:.3f}{success} | "
            f"buffer {r.buffer_depth} | learner busy {r.learner_busy:.0%} | "
            f"loss {r.train.get('loss', float('nan')):.4f}")
