"""What a checkpoint holds, and the one place that saves and restores it.

A checkpoint of version N (README, "The run directory") is the train state (params,
optimizer state, step) and a JSON record:
  step, version, seed;
  data        the prompt source's cursor and the prompts waiting to be retried;
  accounting  the counts of closed attempts (consumed, excluded by reason, retried);
  redo        the prompts of the attempts open (in flight or buffered) at the checkpoint:
              a resumed run generates exactly those again;
  versions    the table of versions so far (Prefect's `model-versions`).
data, accounting and redo are one snapshot of the intake, taken under its lock.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Protocol

from tasks.buffer.intake import IntakeRules
from tasks.records.atomic import write_json_atomic
from tasks.runtime.checkpoints import Checkpoints


class VersionRecorder(Protocol):
    """Where committed versions are recorded: Prefect, through the learner task
    (`tasks.records.artifacts.record_version` takes these fields)."""

    def version(self, **fields) -> None: ...


@dataclasses.dataclass(frozen=True)
class Restored:
    state: Any  # the train state, placed as the abstract state asked
    step: int
    version: int
    path: Path


class RunState:
    """Saves and restores a run: the train state with the intake's snapshot and the versions table."""

    def __init__(self, checkpoints: Checkpoints, rules: IntakeRules, recorder: VersionRecorder, *,
                 run_name: str, seed: int, run_dir: Path):
        self.checkpoints, self.rules, self.recorder = checkpoints, rules, recorder
        self.run_name, self.seed, self.run_dir = run_name, seed, run_dir
        self.rows: list[dict] = []  # one per version checkpointed: `model-versions`
        self._uncommitted: dict | None = None  # the record of a checkpoint still being written

    def restore(self, abstract_state: Any) -> Restored | None:
        """The latest checkpoint, its intake snapshot restored into the rules; None if there is none."""
        latest = self.checkpoints.latest_version()
        if latest is None:
            return None
        state, record = self.checkpoints.restore(latest, abstract_state)
        self.rules.restore(record)
        self.rows = record["versions"]
        return Restored(state, record["step"], latest, self.checkpoints.path(latest))

    def save(self, state: Any, *, step: int, version: int, reward_mean: float) -> None:
        """Starts writing version `version`'s checkpoint; records the previous one, now committed."""
        self.commit()
        parent = self.checkpoints.latest_version()  # the last version checkpointed
        self.rows.append({"version": version, "step": step, "checkpoint": str(self.checkpoints.path(version)),
                          "parent": parent, "reward_mean": reward_mean, "time": time.time()})
        record = {"step": step, "version": version, "seed": self.seed, **self.rules.snapshot(),
                  "versions": self.rows}
        path = self.checkpoints.save(version, state, record)
        self.write_accounting()
        self._uncommitted = dict(
            run_name=self.run_name, spec_path=self.run_dir / "spec.yaml", checkpoint=path,
            parent=self.checkpoints.path(parent) if parent is not None else None,
            version=version, step=step, metrics={"reward_mean": reward_mean}, rows=list(self.rows))

    def commit(self) -> None:
        """Waits for the checkpoint being written, then records it (Prefect sees only committed ones)."""
        self.checkpoints.wait()
        if self._uncommitted is not None:
            self.recorder.version(**self._uncommitted)
            self._uncommitted = None

    def write_accounting(self) -> dict:
        accounting = self.rules.accounting()
        write_json_atomic(self.run_dir / "accounting.json", accounting)
        return accounting

    def close(self) -> None:
        self.checkpoints.close()
