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

A checkpoint that does not restore (an array or the record cut short by a full disk or a
power loss) is set aside with a warning, and the one before it restored instead. One that
does not fit the spec (its model changed) is no damage: the restore fails, unretried.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Callable, Protocol

from tasks.buffer.intake import IntakeRules
from tasks.records.atomic import write_json_atomic
from tasks.records.versions import WARMUP_PARENT
from tasks.runtime.state.checkpoints import Checkpoints
from tasks.runtime.session.failures import CheckpointMismatch
from tasks.run_dir import RunDir


class VersionRecorder(Protocol):
    """Where committed versions are recorded: Prefect, through the learner task
    (`tasks.records.artifacts.record_version` takes these fields, with the table in place of
    `row`: the task shows the table of the run directory, `RunDir.versions_table`, with each
    version's `row` added as it commits; the whole table on every event would outgrow the
    pipe to the task in a long run)."""

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
                 run_name: str, seed: int, run_dir: Path, warn: Callable[[str], None], origin: Path | None = None):
        """`origin`: the checkpoint the first version was trained from (a warm-up's), if any."""
        self.checkpoints, self.rules, self.recorder, self.warn = checkpoints, rules, recorder, warn
        self.origin = origin
        self.run_name, self.seed, self.run_dir = run_name, seed, run_dir
        self.rows: list[dict] = []  # one per version checkpointed: `model-versions`, in each record
        self._uncommitted: dict | None = None  # the record of a checkpoint still being written

    def restore(self, abstract_state: Any) -> Restored | None:
        """The latest checkpoint that restores, its intake snapshot restored into the rules;
        None if there is none. Damaged later ones are set aside, loudly; if none restores,
        raises, and moves nothing (the cause may be the disk, mended by the next attempt).
        A checkpoint of other shapes than the spec's is no damage: CheckpointMismatch, at
        once, nothing moved (every attempt would fail the same way)."""
        damaged: list[tuple[int, Exception]] = []
        for version in reversed(self.checkpoints.versions()):
            try:
                state, record = self.checkpoints.restore(version, abstract_state)
                self.rules.restore(record)
                self.rows, step = record["versions"], record["step"]
            except Exception as e:  # Orbax's errors name no common type: a truncated array, bad JSON
                self._raise_if_mismatched(version, abstract_state, e)
                damaged.append((version, e))
                continue
            self._set_aside(damaged, version)
            return Restored(state, step, version, self.checkpoints.path(version))
        if damaged:
            raise RuntimeError(f"no checkpoint in {self.checkpoints.directory} restores: "
                               + "; ".join(f"version {v}: {type(e).__name__}: {str(e)[:200]}" for v, e in damaged))
        return None

    def _raise_if_mismatched(self, version: int, abstract_state: Any, error: Exception) -> None:
        differ = self.checkpoints.mismatch(version, abstract_state)
        if differ:
            more = f"; and {len(differ) - 3} more" if len(differ) > 3 else ""
            raise CheckpointMismatch(
                f"checkpoint {version} in {self.checkpoints.directory} does not fit this spec: "
                + "; ".join(differ[:3]) + more + ": the spec's model and learner sections must match the run's, "
                "those its checkpoints were trained with; set them back, or train this spec in another "
                "checkpoint.dir (or with --fresh, which moves this run aside)") from error

    def _set_aside(self, damaged: list[tuple[int, Exception]], restored: int) -> None:
        for version, error in damaged:
            aside = self.checkpoints.set_aside(version)
            self.warn(f"checkpoint {version} is damaged and does not restore ({type(error).__name__}: "
                      f"{str(error)[:300]}); moved to {aside}. Resuming from version {restored}: "
                      "the steps after it are trained again")

    def save(self, state: Any, *, step: int, version: int, reward_mean: float) -> None:
        """Starts writing version `version`'s checkpoint; records the previous one, now committed."""
        self.commit()
        parent = self.checkpoints.latest_version()  # the last version checkpointed
        first_parent = WARMUP_PARENT if self.origin is not None else None
        self.rows.append({"version": version, "step": step, "checkpoint": str(self.checkpoints.path(version)),
                          "parent": parent if parent is not None else first_parent, "reward_mean": reward_mean,
                          "time": time.time()})
        record = {"step": step, "version": version, "seed": self.seed, **self.rules.snapshot(),
                  "versions": self.rows}
        path = self.checkpoints.save(version, state, record)
        self.write_accounting()
        self._uncommitted = dict(
            run_name=self.run_name, spec_path=RunDir(self.run_dir).spec, checkpoint=path,
            parent=self.checkpoints.path(parent) if parent is not None else self.origin,
            version=version, step=step, metrics={"reward_mean": reward_mean}, row=self.rows[-1])

    def commit(self) -> None:
        """Waits for the checkpoint being written, then records it (Prefect sees only committed ones)."""
        self.checkpoints.wait()
        if self._uncommitted is not None:
            self.recorder.version(**self._uncommitted)
            self._uncommitted = None

    def write_accounting(self, stopped: dict | None = None) -> dict:
        """Writes `accounting.json`; at the session's end with why training `stopped`
        (reason, message, step, version), which `tandem report` shows."""
        accounting = self.rules.accounting()
        write_json_atomic(RunDir(self.run_dir).accounting,
                          accounting if stopped is None else {**accounting, "stopped": stopped})
        return accounting

    def close(self) -> None:
        self.checkpoints.close()
