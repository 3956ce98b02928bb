"""What Prefect records of a run: each version as an asset with lineage, and tables of them.

Asset keys are the checkpoint's own location, so the UI's lineage reads
spec -> v1 -> v2 -> ... and each node says where its weights are.
"""

from __future__ import annotations

from pathlib import Path

from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.assets import Asset, AssetProperties, materialize
from prefect.cache_policies import NO_CACHE

VERSIONS_ARTIFACT = "model-versions"


def asset_key(path: Path) -> str:
    return path.resolve().as_uri()


def record_version(*, run_name: str, spec_path: Path, checkpoint: Path, parent: Path | None,
                   version: int, step: int, metrics: dict, rows: list[dict]) -> None:
    """Materializes the version's asset (deps: the spec and the parent version) and
    refreshes the `model-versions` table with `rows` (one per version so far)."""
    asset = Asset(key=asset_key(checkpoint),
                  properties=AssetProperties(name=f"{run_name} v{version}",
                                             description=f"step {step}, version {version}"))
    deps = [asset_key(spec_path)] + ([asset_key(parent)] if parent else [])

    @materialize(asset, asset_deps=deps, cache_policy=NO_CACHE,
                 task_run_name=f"version-{version}", persist_result=False)
    def checkpoint_version() -> None:
        asset.add_metadata({"step": step, "version": version, "path": str(checkpoint), **metrics})

    checkpoint_version()
    create_table_artifact(key=VERSIONS_ARTIFACT, table=rows,
                          description=f"Model versions of run {run_name}")


def record_summary(*, run_name: str, markdown: str) -> None:
    create_markdown_artifact(key="run-summary", markdown=markdown,
                             description=f"Summary of run {run_name}")
