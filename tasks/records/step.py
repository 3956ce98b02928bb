"""One learner step's record (a line of `metrics.jsonl`), and the meter that builds it.

cleanba-style: every hop of the loop is timed (taking a batch, the train step, handing
weights over), and the versions are logged beside the buffer's staleness.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from learner.trajectory import Group
from tasks.buffer.stats import IntakeCounts

if TYPE_CHECKING:
    from tasks.runtime.session.learner import Update


@dataclasses.dataclass(frozen=True)
class StepRecord:
    """A learner step, as README's "The run directory" lists its fields.

    `reward_mean` and `success_rate` are the acting policy's: over every group finished since
    the previous record, trained on or filtered (None while the environment reports no
    success); `trained_reward_mean` is the batch's. `filtered_share` is the acting policy's
    too: of those groups, the share an entry filter dropped (None until one finished).
    Where no group finished since the previous record, all three carry its values.
    `train` holds the loss metrics.
    """

    step: int
    version: int
    time: float
    reward_mean: float
    trained_reward_mean: float
    success_rate: float | None
    filtered_share: float | None  # of the groups finished (buffered or filtered), filtered
    learner_busy: float  # fraction of wall time in train steps since the previous record
    train_s: float
    take_s: float  # taking the batch from the buffer, waiting included
    publish_s: float  # handing weights over to be published
    publish_lag_s: float  # until the last version sent reached the actors
    buffer_depth: int
    in_flight: int  # attempts being played or queued at the actors
    excluded: dict[str, int]  # so far, by reason
    retried: int
    compiles: int
    padding: float
    wait_s: float  # learner waiting on an empty buffer
    wait_count: int
    blocked_s: float  # actors blocked on a full buffer
    staleness_mean: float
    staleness_max: int
    staleness_hist: dict[str, int]
    staleness_in_flight_mean: float
    staleness_in_queue_mean: float
    # Of the tokens this update trains on: versions behind the learner's, and optimizer
    # updates between the weights that generated them and those being updated.
    token_staleness_mean: float
    token_staleness_updates_mean: float
    trained_success_rate: float | None  # of the batch's episodes
    prompt_ids: list[int]  # consumed at this step
    train: dict[str, float]

    def to_json(self) -> dict[str, Any]:
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "train"}
        for optional in ("success_rate", "filtered_share", "trained_success_rate"):
            if fields[optional] is None:
                del fields[optional]
        return {**fields, **self.train}


class StepMeter:
    """Builds each step's record from the loop's measurements and the session's parts.

    Args (read-only views, never reset by the meter):
      reader: the buffer's learner end (`depth`).
      ledger: the attempts' accounting (`excluded`, `retried`).
      weights: the weight source (`current` version, `lag_s`).
      learner: the learner (`compiles`).
    """

    def __init__(self, reader, ledger, weights, learner):
        self._reader, self._ledger, self._weights, self._learner = reader, ledger, weights, learner
        self._last = time.perf_counter()
        self._acting: tuple[float, float | None] | None = None  # latest (reward, success) of finished groups
        self._filtered_share: float | None = None  # latest, of finished groups
        self._take_s = self._publish_s = 0.0  # since the last record

    def took(self, seconds: float) -> None:
        self._take_s += seconds

    def published(self, seconds: float) -> None:
        self._publish_s += seconds

    def record(self, update: "Update", groups: Sequence[Group], intake: IntakeCounts) -> StepRecord:
        now = time.perf_counter()
        elapsed, self._last = now - self._last, now
        trained = float(np.concatenate([g.rewards for g in groups]).mean())
        if intake.episodes:
            success = intake.successes / intake.judged if intake.judged else None
            self._acting = (intake.reward_sum / intake.episodes, success)
        reward, success = self._acting or (trained, None)
        if intake.filtered_share is not None:
            self._filtered_share = intake.filtered_share
        version = self._weights.current
        behind, updates = _token_staleness(groups, version, update.step, self._weights.interval)
        take_s, publish_s, self._take_s, self._publish_s = self._take_s, self._publish_s, 0.0, 0.0
        return StepRecord(
            step=update.step, version=version, time=time.time(), reward_mean=reward,
            trained_reward_mean=trained, success_rate=success, filtered_share=self._filtered_share,
            learner_busy=min(1.0, update.train_s / elapsed) if elapsed > 0 else 1.0,
            train_s=update.train_s, take_s=take_s, publish_s=publish_s, publish_lag_s=self._weights.lag_s,
            buffer_depth=self._reader.depth, in_flight=self._ledger.in_flight, excluded=dict(self._ledger.excluded), retried=self._ledger.retried,
            compiles=self._learner.compiles, padding=update.metrics["padding"],
            wait_s=intake.wait_s, wait_count=intake.wait_count, blocked_s=intake.blocked_s,
            staleness_mean=_mean(intake.staleness), staleness_max=max(intake.staleness, default=0),
            staleness_hist=_histogram(intake.staleness),
            staleness_in_flight_mean=_mean(intake.in_flight), staleness_in_queue_mean=_mean(intake.in_queue),
            token_staleness_mean=behind, token_staleness_updates_mean=updates,
            trained_success_rate=_success(groups), prompt_ids=[g.prompt_id for g in groups],
            train={k: v for k, v in update.metrics.items() if k != "padding"})


def _token_staleness(groups: Sequence[Group], version: int, step: int, interval: int) -> tuple[float, float]:
    """Mean over the generated tokens of the batch: the learner's version minus theirs, and
    the updates since their weights (version v is the weights after v × interval updates;
    the update making `step` starts from the weights after step − 1)."""
    versions = np.concatenate([s.versions[s.generated] for g in groups for s in g.samples])
    return float(version - versions.mean()), float(step - 1 - interval * versions.mean())


def _success(groups: Sequence[Group]) -> float | None:
    judged = [s.success for g in groups for s in g.samples if s.success is not None]
    return float(np.mean(judged)) if judged else None


def _mean(values: list[int]) -> float:
    return float(np.mean(values)) if values else 0.0


def _histogram(values: list[int]) -> dict[str, int]:
    """Counts by staleness; string keys, as JSON needs."""
    counts = collections.Counter(values)
    return {str(k): counts[k] for k in sorted(counts)}
