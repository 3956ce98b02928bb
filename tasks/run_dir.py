"""A run directory: the one place that names its files, and reads its versions.

  spec.yaml                the run's spec, as it last ran
  checkpoints/{N}/         version N's checkpoint (`tasks.runtime.state.checkpoints`)
  warmup/checkpoints/{K}/  the warm-up's checkpoint after K updates; the last is version 0 (`tasks.warmup`)
  warmup/metrics.jsonl     one record per warm-up update: its loss and the demonstrations it read
  warmup/finished          the warm-up's last update, once its checkpoint (version 0) is committed
  metrics.jsonl            one record per step, and the eval series (`tasks.records.metrics_log`)
  accounting.json          every prompt drawn, where it is now (`tasks.buffer.ledger`)
  episodes/v{N}.jsonl      a few episodes of training per version (`tasks.records.episodes`)
  episodes/eval/v{N}.jsonl every episode of version N's evaluation
  eval/                    evaluation results (`tasks.eval.results`)
  tensorboard/, report/    `tandem report`'s event files and plots
  tandem.log               the run's log, tracebacks whole
  learner.lock, learner.pid  held and written by the learner process while it runs
  flow-run                 the id of the flow run that trains it, or last did

Only this module spells those names; the rest of Tandem asks a `RunDir`. The run's
versions table lives in the checkpoints' records (`versions_table`), nowhere else on disk.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class RunDir:
    path: Path

    @property
    def spec(self) -> Path:
        return self.path / "spec.yaml"

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def warmup(self) -> Path:
        return self.path / "warmup"

    @property
    def warmup_checkpoints(self) -> Path:
        return self.warmup / "checkpoints"

    @property
    def warmup_metrics(self) -> Path:
        return self.warmup / "metrics.jsonl"

    @property
    def warmup_finished(self) -> Path:
        return self.warmup / "finished"

    def warmed_up(self) -> Path | None:
        """The finished warm-up's last checkpoint (the run's version 0), or None."""
        if not self.warmup_finished.is_file():
            return None
        return self.warmup_checkpoints / self.warmup_finished.read_text().strip()

    @property
    def metrics(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def accounting(self) -> Path:
        return self.path / "accounting.json"

    @property
    def episodes(self) -> Path:
        return self.path / "episodes"

    @property
    def eval_episodes(self) -> Path:
        return self.episodes / "eval"

    @property
    def eval(self) -> Path:
        return self.path / "eval"

    @property
    def tensorboard(self) -> Path:
        return self.path / "tensorboard"

    @property
    def eval_tensorboard(self) -> Path:
        return self.tensorboard / "eval"

    @property
    def report(self) -> Path:
        return self.path / "report"

    @property
    def log(self) -> Path:
        return self.path / "tandem.log"

    @property
    def lock(self) -> Path:
        return self.path / "learner.lock"

    def pid(self, host: int = 0) -> Path:
        """The pid file of the learner process of host `host` (0: the lead)."""
        return self.path / ("learner.pid" if host == 0 else f"learner.{host}.pid")

    @property
    def flow_run(self) -> Path:
        return self.path / "flow-run"

    def versions(self) -> list[int]:
        return committed_versions(self.checkpoints)

    def latest_version(self) -> int | None:
        return max(self.versions(), default=None)

    def checkpoint_record(self, version: int) -> dict:
        """Version `version`'s checkpoint record: its step, data cursor and accounting."""
        from tasks.runtime.state.checkpoints import Checkpoints  # Orbax: only when a checkpoint is read

        checkpoints = Checkpoints(self.checkpoints, keep=None)
        try:
            return checkpoints.record(version)
        finally:
            checkpoints.close()

    def versions_table(self) -> list[dict]:
        """The run's versions table, one row per version checkpointed (`model-versions`): the
        one each checkpoint's record carries, read from the latest that reads; [] with none."""
        for version in reversed(self.versions()):
            try:
                return self.checkpoint_record(version)["versions"]
            except Exception:  # damaged (the learner sets it aside on restore), or just replaced
                continue
        return []

    def checkpoint_step(self, version: int) -> int:
        """The step version `version` was published at, as its checkpoint records it (not
        `version × sync.interval`: a resume may have changed the interval)."""
        return self.checkpoint_record(version)["step"]


def committed_versions(directory: Path) -> list[int]:
    """The versions whose checkpoints in `directory` are committed (Orbax's temporary
    directories, N.orbax-checkpoint-tmp-..., are not versions); [] with no directory."""
    if not directory.is_dir():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())
