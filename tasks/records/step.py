"""Per-step metrics records and the progress lines the terminal (and Prefect UI) shows."""

from __future__ import annotations

import collections
import time

import numpy as np

from learner.trajectory import Group
from tasks.buffer.ledger import Ledger
from tasks.buffer.reader import BufferReader


class StepMeter:
    """Builds one `metrics.jsonl` record per step and logs a line every `every_s` seconds.

    `reward_mean` and `success_rate` are the acting policy's: over every group finished
    since the previous record, trained on or filtered; `trained_reward_mean` is the batch's.
    """

    def __init__(self, log, every_s: float = 2.0):
        self.log, self.every_s = log, every_s
        self._last_record = time.perf_counter()
        self._last_log = 0.0
        self._acting: dict = {}  # the latest rollout performance, kept while no group finishes
        self._take_s = self._publish_s = 0.0  # since the last record
        self._publish_lag_s = 0.0

    def took(self, seconds: float) -> None:
        """Time the learner spent taking a batch from the buffer (waiting included)."""
        self._take_s += seconds

    def published(self, seconds: float, lag_s: float) -> None:
        """Time the learner spent publishing weights to the actors, and how long the last
        version sent took to reach them (sent in the background, in async mode)."""
        self._publish_s += seconds
        self._publish_lag_s = lag_s

    def record(self, step: int, version: int, groups: list[Group], train: dict, train_s: float,
               reader: BufferReader, compiles: int, ledger: Ledger) -> dict:
        now = time.perf_counter()
        elapsed, self._last_record = now - self._last_record, now
        rewards = np.concatenate([g.rewards for g in groups])
        intake = reader.pop_stats()
        if intake.episodes:
            self._acting = {"reward_mean": intake.reward_sum / intake.episodes}
            if intake.judged:
                self._acting["success_rate"] = intake.successes / intake.judged
        record = {
            "step": step,
            "version": version,
            "time": time.time(),
            "reward_mean": self._acting.get("reward_mean", float(rewards.mean())),
            "trained_reward_mean": float(rewards.mean()),
            "learner_busy": min(1.0, train_s / elapsed) if elapsed > 0 else 1.0,
            "train_s": train_s,
            "take_s": self._take_s,
            "publish_s": self._publish_s,
            "publish_lag_s": self._publish_lag_s,
            "buffer_depth": reader.depth,
            "excluded": dict(ledger.excluded),
            "compiles": compiles,
            "padding": train["padding"],
            "wait_s": intake.wait_s,
            "wait_count": intake.wait_count,
            "blocked_s": intake.blocked_s,
            "staleness_mean": _mean(intake.staleness),
            "staleness_max": max(intake.staleness, default=0),
            "staleness_hist": _histogram(intake.staleness),
            "staleness_in_flight_mean": _mean(intake.in_flight),
            "staleness_in_queue_mean": _mean(intake.in_queue),
            "retried": ledger.retried,
            "prompt_ids": [g.prompt_id for g in groups],
            **{k: v for k, v in train.items() if k != "padding"},
        }
        if "success_rate" in self._acting:
            record["success_rate"] = self._acting["success_rate"]
        self._take_s = self._publish_s = 0.0
        if now - self._last_log >= self.every_s:
            self._last_log = now
            self.log.info(_line(record))
        return record


def _line(r: dict) -> str:
    success = f" success {r['success_rate']:.0%}" if "success_rate" in r else ""
    return (f"step {r['step']} version {r['version']} | reward {r['reward_mean']:.3f}{success} | "
            f"buffer {r['buffer_depth']} | learner busy {r['learner_busy']:.0%} | "
            f"loss {r.get('loss', float('nan')):.4f}")


def _mean(values: list[int]) -> float:
    return float(np.mean(values)) if values else 0.0


def _histogram(values: list[int]) -> dict[str, int]:
    """Counts by staleness; string keys, as JSON needs."""
    counts = collections.Counter(values)
    return {str(k): counts[k] for k in sorted(counts)}
