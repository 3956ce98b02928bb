"""When a session's training ends: at `learner.steps`, or early once the acting policy is
good enough (`learner.stop_at_success`, averaged over the last `learner.stop_window` steps;
checked when a version is published, so the run ends on a checkpoint)."""

from __future__ import annotations

import collections
from typing import Callable

import numpy as np

from learner.config import LearnerConfig
from tasks.records.step import StepRecord


class Stopping:
    def __init__(self, config: LearnerConfig, log: Callable[[str], None]):
        self.steps, self.target, self.window, self.log = config.steps, config.stop_at_success, config.stop_window, log
        self._success: collections.deque[float] = collections.deque(maxlen=config.stop_window)

    def write(self, record: StepRecord) -> None:
        """A step's record (a sink, like the loggers): its success rate joins the window."""
        self._success.append(record.success_rate or 0.0)

    def finished(self, step: int) -> bool:
        return step >= self.steps

    def converged(self) -> bool:
        """Whether the success target is reached over a full window."""
        if self.target is None or len(self._success) < self.window:
            return False
        if np.mean(self._success) >= self.target:
            self.log(f"success {np.mean(self._success):.1%} over the last {self.window} steps: stopping")
            return True
        return False
