"""A learner session: one attempt of the learner task, wiring parts built by
`tasks.runtime.session.build.build_session`.

It publishes the weights, starts the actors, then takes groups and trains; every
`sync.interval` steps it publishes a version and checkpoints it. It runs in the learner's
own process and touches no Prefect API itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Callable

from tasks.actors.pool import ActorPool
from tasks.buffer.exchange import Exchange
from tasks.buffer.reader import BufferReader
from tasks.records.loggers import Loggers
from tasks.records.step import StepMeter, StepRecord
from tasks.runtime.session.learner import Learner
from tasks.runtime.state.run_state import RunState
from tasks.runtime.session.no_signal import NoSignal, SignalWatch
from tasks.runtime.session.stopping import NoSignalFailure, Stop, StopReason, StopRule, StopTraining
from tasks.runtime.session.weights import WeightSource


@dataclasses.dataclass
class Session:
    learner: Learner
    weights: WeightSource
    reader: BufferReader
    exchange: Exchange
    actors: ActorPool
    run_state: RunState
    meter: StepMeter
    loggers: Loggers
    stopping: StopRule
    signal: SignalWatch  # told when each batch begins; asked (through the reader) while it waits
    batch_groups: int
    checkpoint_every: int  # versions between checkpoints
    synchronous: bool  # learner.mode sync: each batch is played with the latest weights
    episodes: Callable[[list], None] = lambda groups: None  # keeps a few of each version's, as text
    # Told of each version (version=, step=, params=, checkpointed=, last=); must not block.
    evaluate: Callable[..., None] = lambda **version: None
    # Set by Ctrl-C or SIGTERM (through the learner task): training ends at the next version,
    # or at once while the learner waits for groups (`StopTraining` from the reader's check).
    interrupted: Callable[[], bool] = lambda: False
    stopped: Stop | None = None  # why training ended
    last: StepRecord | None = None  # the latest step's record
    _saved: int | None = dataclasses.field(default=None, init=False)  # the step last checkpointed
    _published: int = dataclasses.field(default=0, init=False)  # the step last published as a version

    def run(self) -> dict:
        """Trains until the stop rule says; returns where and why it ended."""
        with contextlib.ExitStack() as stack:  # stops, in reverse order: exchange, actors, weights, ...
            for stop in (self.loggers.close, self.run_state.close, self._write_accounting,
                         self.exchange.release, self.weights.stop, self.actors.stop, self.exchange.stop):
                stack.callback(stop)
            self.exchange.start()
            self.weights.start()
            self.weights.publish(self.learner.params(), new_version=False)
            self.actors.start()
            first = self.learner.step_count
            self._published = first
            self._saved = first if self.run_state.checkpoints.versions() else None  # restored, or a new run
            try:
                while not (self._stops_before(self.learner.step_count, first) or self._train_batch()):
                    pass
            except SystemExit:  # stopped at once (`tasks.runtime.processes.task`): why, written first, as it may be killed soon
                self.stopped = self.stopped or Stop(StopReason.INTERRUPTED, "stopped at once")
                self._write_accounting()
                raise
            self.run_state.commit()
        return {"step": self.learner.step_count, "version": self.weights.current,
                "accounting": self.run_state.rules.accounting(),
                "stopped": self.stopped.reason.value, "message": self.stopped.message}

    def _stops_before(self, step: int, first: int) -> bool:
        """Whether to end before the next batch: at the step target, or interrupted before
        this session trained (`first`, the step it started from, is checkpointed if any is);
        once it has, an interrupt ends it at the next version (`_sync`)."""
        if (stop := self.stopping.after_step(step)) is not None:
            self.stopped = stop
        elif self.interrupted() and step == first:
            self.stopped = Stop(StopReason.INTERRUPTED, "interrupted before training")
        return self.stopped is not None

    def _train_batch(self) -> bool:
        """Takes a batch and trains on it; True once training should end."""
        start = time.perf_counter()
        self.signal.batch_started()
        try:
            groups = self.reader.take(self.batch_groups)
        except StopTraining as e:  # an interrupt while waiting: every batch taken was trained
            self._stop_between_batches(e.stop)
            return True
        except NoSignal as e:
            self._stop_between_batches(self.stopping.no_signal(e, self.last))
            if self.stopped.reason is StopReason.NO_SIGNAL and self.stopping.fails_on_no_signal:
                raise NoSignalFailure(self.stopped.message) from None
            return True
        self.meter.took(time.perf_counter() - start)
        self.episodes(groups)
        for update in self.learner.step(groups):
            self.last = record = self.meter.record(update, groups, self.reader.pop_stats())
            self.loggers.write(record)
            self.stopping.observe(record)
            if self.weights.due(update.step) and self._sync(update.step, record.reward_mean):
                return True
            if (stop := self.stopping.after_step(update.step)) is not None:
                self.stopped = stop
                return True
        return False

    def _sync(self, step: int, reward_mean: float) -> bool:
        """Publishes a version, checkpoints it when due; True once training should end."""
        start = time.perf_counter()
        params = self.learner.params()
        version = self.weights.publish(params)
        self._published = step
        if self.synchronous:
            self.weights.wait()
        self.meter.published(time.perf_counter() - start)
        # An interrupt ends the run here, on a version, so that its last steps are
        # checkpointed: a resumed run neither loses nor repeats them.
        self.stopped = self.stopping.at_version(step) or (
            Stop(StopReason.INTERRUPTED, "interrupted") if self.interrupted() else None)
        checkpointed = self.stopped is not None or version % self.checkpoint_every == 0
        if checkpointed:
            self._save(step, version, reward_mean)
        self.evaluate(version=version, step=step, params=params, checkpointed=checkpointed,
                      last=self.stopped is not None and self.stopped.reason != StopReason.INTERRUPTED)
        return self.stopped is not None

    def _stop_between_batches(self, stop: Stop) -> None:
        """Ends training where it stands: publishes the steps since the last version, if
        any, as one, and checkpoints it unless it is checkpointed already."""
        self.stopped, step = stop, self.learner.step_count
        if step == self._saved:
            return
        params = self.learner.params()
        version = self.weights.publish(params) if step != self._published else self.weights.current
        self._published = step
        self._save(step, version, self.last.reward_mean if self.last is not None else 0.0)
        self.evaluate(version=version, step=step, params=params, checkpointed=True,
                      last=stop.reason != StopReason.INTERRUPTED)

    def _save(self, step: int, version: int, reward_mean: float) -> None:
        self.run_state.save(self.learner.state(), step=step, version=version, reward_mean=reward_mean)
        self._saved = step

    def _write_accounting(self) -> None:
        stopped = None if self.stopped is None else {
            "reason": self.stopped.reason.value, "message": self.stopped.message,
            "step": self.learner.step_count, "version": self.weights.current}
        self.run_state.write_accounting(stopped=stopped)
