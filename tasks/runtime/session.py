"""A learner session: one attempt of the learner task, wiring parts built by
`tasks.runtime.build.build_session`.

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
from tasks.records.step import StepMeter
from tasks.runtime.learner import Learner
from tasks.runtime.run_state import RunState
from tasks.runtime.stopping import Stopping
from tasks.runtime.weights import WeightSource


@dataclasses.dataclass
class Session:
    learner: Learner
    weights: WeightSource
    reader: BufferReader
    exchange: Exchange
    actors: ActorPool
    run_state: RunState
    meter: StepMeter
    loggers: Loggers  # the stop condition among them
    stopping: Stopping
    batch_groups: int
    checkpoint_every: int  # versions between checkpoints
    synchronous: bool  # learner.mode sync: each batch is played with the latest weights
    episodes: Callable[[list], None] = lambda groups: None  # keeps a few of each version's, as text
    # Told of each version (version=, step=, params=, checkpointed=, last=); must not block.
    evaluate: Callable[..., None] = lambda **version: None
    # Set by Ctrl-C (through the learner task): training ends at the next version.
    interrupted: Callable[[], bool] = lambda: False
    stopped: str | None = None  # why training ended: "steps", "success" or "interrupted"

    def run(self) -> dict:
        """Trains until `learner.steps` or the success target; returns where it ended."""
        with contextlib.ExitStack() as stack:  # stops, in reverse order: exchange, actors, weights, ...
            for stop in (self.loggers.close, self.run_state.close, self.run_state.write_accounting,
                         self.exchange.release, self.weights.stop, self.actors.stop, self.exchange.stop):
                stack.callback(stop)
            self.exchange.start()
            self.weights.start()
            self.weights.publish(self.learner.params(), new_version=False)
            self.actors.start()
            first = self.learner.step_count
            while not (self._stops_before(self.learner.step_count, first) or self._train_batch()):
                pass
            self.run_state.commit()
        return {"step": self.learner.step_count, "version": self.weights.current,
                "accounting": self.run_state.rules.accounting(), "stopped": self.stopped}

    def _stops_before(self, step: int, first: int) -> bool:
        """Whether to end before the next batch: at the step target, or interrupted before
        this session trained (`first`, the step it started from, is checkpointed if any is);
        once it has, an interrupt ends it at the next version (`_sync`)."""
        if self.stopping.finished(step):
            self.stopped = "steps"
        elif self.interrupted() and step == first:
            self.stopped = "interrupted"
        return self.stopped is not None

    def _train_batch(self) -> bool:
        """Takes a batch and trains on it; True once training should end."""
        start = time.perf_counter()
        groups = self.reader.take(self.batch_groups)
        self.meter.took(time.perf_counter() - start)
        self.episodes(groups)
        for update in self.learner.step(groups):
            record = self.meter.record(update, groups, self.reader.pop_stats())
            self.loggers.write(record)
            if (self.weights.due(update.step) and self._sync(update.step, record.reward_mean)
                    or self.stopping.finished(update.step)):
                return True
        return False

    def _sync(self, step: int, reward_mean: float) -> bool:
        """Publishes a version, checkpoints it when due; True once training should end."""
        start = time.perf_counter()
        params = self.learner.params()
        version = self.weights.publish(params)
        if self.synchronous:
            self.weights.wait()
        self.meter.published(time.perf_counter() - start)
        # An interrupt ends the run here, on a version, so that its last steps are
        # checkpointed: a resumed run neither loses nor repeats them.
        self.stopped = ("steps" if self.stopping.finished(step) else "success" if self.stopping.converged()
                        else "interrupted" if self.interrupted() else None)
        checkpointed = self.stopped is not None or version % self.checkpoint_every == 0
        if checkpointed:
            self.run_state.save(self.learner.state(), step=step, version=version, reward_mean=reward_mean)
        self.evaluate(version=version, step=step, params=params, checkpointed=checkpointed,
                      last=self.stopped in ("steps", "success"))
        return self.stopped is not None
