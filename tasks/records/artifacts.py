"""What Prefect records of a run: each version as an asset with lineage, and tables of them;
the learner's progress; the summary at the end, with its plots.

Asset keys are the checkpoint's own location, so the lineage reads spec -> v1 -> v2 -> ...
and each node says where its weights are (Prefect Cloud's assets page draws it). The
open-source UI has no assets page: there each run has its own `<run>-versions` table
and `<run>-lineage` diagram (Markdown with Mermaid), keyed by the run's name (`run_key`),
so that an artifact key's page shows that run's and no other's.
"""

from __future__ import annotations

import base64
import re
import time
from pathlib import Path
from typing import Mapping
from uuid import UUID

from prefect.artifacts import (create_markdown_artifact, create_progress_artifact,
                               create_table_artifact, update_progress_artifact)
from prefect.assets import Asset, AssetProperties, materialize
from prefect.cache_policies import NO_CACHE

from tasks.records.versions import lineage_markdown, readable_rows

VERSIONS_ARTIFACT = "versions"  # a run's table: key `<run>-versions` (`run_key`)
LINEAGE_ARTIFACT = "lineage"  # a run's diagram: key `<run>-lineage`
SUMMARY_ARTIFACT = "run-summary"
PROGRESS_ARTIFACT = "learner-progress"


def asset_key(path: Path) -> str:
    return path.resolve().as_uri()


def run_key(run_name: str, flow_run_name: str | None = None) -> str:
    """The start of a run's artifact keys: the spec's name, and the Prefect flow run's
    (two runs of one spec differ in it), made an artifact key (lowercase letters, digits
    and dashes: Prefect refuses anything else)."""
    words = " ".join(filter(None, [run_name, flow_run_name])).lower()
    return re.sub(r"[^a-z0-9]+", "-", words).strip("-") or "tandem"


def record_version(*, run_name: str, spec_path: Path, checkpoint: Path, parent: Path | None,
                   version: int, step: int, metrics: dict, rows: list[dict], key: str) -> None:
    """Materializes the version's asset (deps: the spec and the parent version) and
    refreshes the run's versions table and lineage (`key`: `run_key`) with `rows` (one per
    version so far)."""
    asset = Asset(key=asset_key(checkpoint),
                  properties=AssetProperties(name=f"{run_name} v{version}",
                                             description=f"step {step}, version {version}"))
    deps = [asset_key(spec_path)] + ([asset_key(parent)] if parent else [])

    @materialize(asset, asset_deps=deps, cache_policy=NO_CACHE,
                 task_run_name=f"version-{version}", persist_result=False)
    def checkpoint_version() -> None:
        asset.add_metadata({"step": step, "version": version, "path": str(checkpoint),
                            "spec": str(spec_path), "parent": str(parent) if parent else None, **metrics})

    checkpoint_version()
    record_versions_table(run_name=run_name, rows=rows, key=key)


def demonstrations_key(source: str, entrypoint: str, seed: int) -> str:
    """The asset key of a warm-up's demonstrations: the file's, or the environment expert's."""
    if source != "env":
        return asset_key(Path(source))
    return f"tandem://demonstrations/{re.sub(r'[^A-Za-z0-9._-]+', '-', entrypoint)}/seed-{seed}"


def record_warmup(*, run_name: str, spec_path: Path, data_key: str, checkpoint: Path, metrics: dict) -> None:
    """Materializes the warm-up's last checkpoint (deps: the spec and the demonstrations):
    the asset upstream of the run's first RL version, whose weights it starts from."""
    asset = Asset(key=asset_key(checkpoint),
                  properties=AssetProperties(name=f"{run_name} v0 (warm-up)",
                                             description=f"warm-up, update {metrics['step']}"))

    @materialize(asset, asset_deps=[asset_key(spec_path), data_key], cache_policy=NO_CACHE,
                 task_run_name="version-0-warm-up", persist_result=False)
    def warmup_version() -> None:
        asset.add_metadata({"path": str(checkpoint), "spec": str(spec_path), "demonstrations": data_key,
                            **{k: metrics[k] for k in ("step", "nll", "demonstrations") if k in metrics}})

    warmup_version()


def record_versions_table(*, run_name: str, rows: list[dict], key: str) -> None:
    """The run's `<key>-versions` table (a row per version: its parent, step, checkpoint,
    time and eval scores) and `<key>-lineage` diagram, of `rows` (`VersionTable.rows`)."""
    table_key = f"{key}-{VERSIONS_ARTIFACT}"
    create_table_artifact(key=table_key, table=readable_rows(rows), description=f"Model versions of run {run_name}")
    create_markdown_artifact(key=f"{key}-{LINEAGE_ARTIFACT}", markdown=lineage_markdown(run_name, rows, table_key),
                             description=f"Lineage of run {run_name}: spec, versions, eval scores")


def record_summary(*, run_name: str, markdown: str, plots: Mapping[str, bytes] | None = None) -> None:
    """The `run-summary` artifact: `markdown`, then each PNG of `plots` embedded as a
    data URI (the Prefect UI renders them; no file server needed)."""
    images = "".join(f"\n## {name}\n\n![{name}](data:image/png;base64,{base64.b64encode(png).decode()})\n"
                     for name, png in (plots or {}).items())
    create_markdown_artifact(key=SUMMARY_ARTIFACT, markdown=markdown + images,
                             description=f"Summary of run {run_name}")


class ProgressRecord:
    """The `learner-progress` artifact: percent of `total_steps` done, created once per
    learner session and updated at most every `every_s` seconds (each update is an API call)."""

    def __init__(self, *, run_name: str, step: int, version: int, total_steps: int, every_s: float = 5.0):
        self.run_name, self.total_steps, self.every_s = run_name, total_steps, every_s
        self._last = time.monotonic()
        self.id: UUID = create_progress_artifact(progress=self._percent(step), key=PROGRESS_ARTIFACT,
                                                 description=self._describe(step, version))

    def update(self, step: int, version: int) -> None:
        """Sends the progress if `every_s` has passed, and always at the last step."""
        now = time.monotonic()
        if step >= self.total_steps or now - self._last >= self.every_s:
            self._last = now
            update_progress_artifact(self.id, self._percent(step), self._describe(step, version))

    def finish(self, step: int, version: int, why: str, *, complete: bool) -> None:
        """The last update: 100% once training is over (`complete`: it ended by itself, not
        interrupted), and `why` it stopped."""
        percent = 100.0 if complete else self._percent(step)
        update_progress_artifact(self.id, percent, f"{self.run_name}: {why} at step {step} of "
                                                   f"{self.total_steps}, version {version}")

    def _percent(self, step: int) -> float:
        return min(100.0, 100.0 * step / self.total_steps) if self.total_steps else 100.0

    def _describe(self, step: int, version: int) -> str:
        return f"{self.run_name}: step {step} of {self.total_steps}, version {version}"
