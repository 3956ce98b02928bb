"""The learner: batches of groups in, optimizer updates out.

Acme's learner shape (`IMPALALearner`): everything it needs is handed to its constructor,
`step` trains, `state`/`restore` are what a checkpoint saves and loads, `params` is what
the weight source publishes. One batch of `learner.batch_groups` groups yields
`minibatches × epochs` steps (optimizer updates), so `step` yields after each of them:
the session publishes a version every `sync.interval` steps, which may fall inside a batch.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Iterator, Sequence

from learner.batching import Batch, batch_of_groups
from learner.config import LearnerConfig
from learner.train import TrainState, TrainStep, params_numpy
from learner.trajectory import Group


@dataclasses.dataclass(frozen=True)
class Update:
    """One optimizer update: the step it made, its metrics and its time in the train step."""

    step: int
    metrics: dict[str, float]  # the loss metrics and `padding` (`learner.train.TrainStep`)
    train_s: float


class Learner:
    """Trains the policy's `TrainState` with `train_step`; the state passed in is owned from then on."""

    def __init__(self, train_step: TrainStep, state: TrainState, config: LearnerConfig):
        self._train_step, self._state, self._config = train_step, state, config

    @property
    def step_count(self) -> int:
        """Optimizer updates so far (restored ones included)."""
        return int(self._state.step)

    @property
    def compiles(self) -> int:
        return self._train_step.compiles

    def step(self, groups: Sequence[Group]) -> Iterator[Update]:
        """Trains on `groups`: yields after each of the batch's `minibatches × epochs` updates."""
        return self.updates(batch_of_groups(groups, self._config))

    def updates(self, batch: Batch, before_each: Callable[[], None] = lambda: None) -> Iterator[Update]:
        """Trains on a packed batch (this host's rows of it, with several hosts): yields after
        each of its `minibatches × epochs` updates; `before_each` runs before each starts."""
        updates = self._train_step.updates(self._state, batch)
        for _ in range(self._config.updates_per_batch):
            before_each()
            start = time.perf_counter()
            self._state, metrics = next(updates)
            yield Update(int(self._state.step), metrics, time.perf_counter() - start)

    def params(self) -> dict[str, Any]:
        """The current weights as host NumPy arrays: what is published to the actors."""
        return params_numpy(self._state)

    def state(self) -> TrainState:
        return self._state

    def restore(self, state: TrainState) -> None:
        self._state = state
