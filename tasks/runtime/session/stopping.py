"""When a session's training ends, and why: the stop rule the session asks.

A run ends by itself, every time, with one of these reasons (README, "How a run ends"):

  steps        `learner.steps` optimizer updates were made;
  success      the acting policy's success rate, averaged over the last `learner.stop_window`
               steps, reached `learner.stop_at_success`;
  plateau      that average has not beaten its best by PLATEAU_GAIN for `learner.plateau_steps`
               steps (success where the environment reports it, else reward);
  no-signal    no group that carries learning signal arrived for a bound
               (`tasks.runtime.session.no_signal`): DAPO's `max_num_gen_batches`, Yu et al. 2025;
  interrupted  Ctrl-C (or SIGTERM), acted on at the next version, or at once while the
               learner waits for groups.

Success and plateau are judged when a version is published, so the run ends on a checkpoint;
no-signal and an interrupt while waiting end it between two batches, where every batch taken
was trained.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import numpy as np

from learner.config import LearnerConfig
from tasks.records.step import StepRecord
from tasks.runtime.session.failures import Unrecoverable
from tasks.runtime.session.no_signal import NoSignal, describe

PLATEAU_GAIN = 0.01  # a rise of the windowed success (or reward) smaller than this is no progress


class StopReason(str, enum.Enum):
    STEPS = "steps"
    SUCCESS = "success"
    PLATEAU = "plateau"
    NO_SIGNAL = "no-signal"
    INTERRUPTED = "interrupted"

    @property
    def reached_target(self) -> bool:
        """Whether training ended where the spec asked (its step or success target)."""
        return self in (StopReason.STEPS, StopReason.SUCCESS)

    @property
    def phrase(self) -> str:
        """How a run that ended so is described: "Stopped early at the success target"."""
        return _PHRASES[self]


_PHRASES = {StopReason.STEPS: "Finished", StopReason.SUCCESS: "Stopped early at the success target",
            StopReason.PLATEAU: "Stopped on a plateau", StopReason.NO_SIGNAL: "Stopped: no learning signal",
            StopReason.INTERRUPTED: "Interrupted"}


@dataclasses.dataclass(frozen=True)
class Stop:
    """Why training ended, in one line a person reads."""

    reason: StopReason
    message: str


class NoSignalFailure(Unrecoverable):
    """No learning signal, with `learner.on_no_signal: fail`: the run fails (after its checkpoint)."""


class StopTraining(Exception):
    """Raised while the learner waits for groups: end training now, between two batches."""

    def __init__(self, stop: Stop):
        super().__init__(stop.message)
        self.stop = stop


class StopRule:
    """Told each step's record; says whether training ends after a step or at a version."""

    def __init__(self, config: LearnerConfig):
        self.config = config
        self.steps, self.target, self.window = config.steps, config.stop_at_success, config.stop_window
        self.plateau_steps = config.plateau_steps
        self.fails_on_no_signal = config.on_no_signal == "fail"
        self._recent: collections.deque[float] = collections.deque(maxlen=config.stop_window)
        self._best: tuple[float, int] | None = None  # (windowed value, step it was reached at)
        self._step = 0

    def observe(self, record: StepRecord) -> None:
        """A step's record: its success rate (reward where no success is reported) joins the window."""
        value = record.success_rate if record.success_rate is not None else record.reward_mean
        self._recent.append(value)
        self._step = record.step
        if len(self._recent) == self.window:
            mean = float(np.mean(self._recent))
            if self._best is None or mean >= self._best[0] + PLATEAU_GAIN:
                self._best = (mean, record.step)

    def after_step(self, step: int) -> Stop | None:
        if step >= self.steps:
            return Stop(StopReason.STEPS, f"reached learner.steps ({self.steps})")
        return None

    def at_version(self, step: int) -> Stop | None:
        """At a published version: the step target, the success target or a plateau."""
        if (stop := self.after_step(step)) is not None:
            return stop
        if len(self._recent) < self.window:
            return None
        mean = float(np.mean(self._recent))
        if self.target is not None and mean >= self.target:
            return Stop(StopReason.SUCCESS, f"success {mean:.1%} over the last {self.window} steps reached "
                                            f"learner.stop_at_success ({self.target:.0%})")
        best, since = self._best
        if self.plateau_steps is not None and step - since >= self.plateau_steps:
            return Stop(StopReason.PLATEAU, f"plateau at {best:.0%} since step {since}: no gain of "
                                            f"{PLATEAU_GAIN:.0%} in {step - since} steps (learner.plateau_steps "
                                            f"{self.plateau_steps}); now {mean:.0%}")
        return None

    def no_signal(self, error: NoSignal, last: StepRecord | None) -> Stop:
        """The stop for a wait without learning signal, with its measured cause. A policy
        that solves (nearly) every prompt starves the learner too, every group filtered for
        all-alike rewards, before its windowed success has caught up: where the episodes
        played during the wait reach `stop_at_success`, the run reached its target."""
        rate = error.success_rate
        if self.target is not None and rate is not None and rate >= self.target:
            since = f"since step {last.step}" if last is not None else "before the first step"
            return Stop(StopReason.SUCCESS, f"success {rate:.1%} over the {error.judged} episodes played {since} "
                                            f"reached learner.stop_at_success ({self.target:.0%}); every group "
                                            f"had the same reward in all its episodes, so none was left to train on")
        return Stop(StopReason.NO_SIGNAL, describe(error, last, self.config))
