"""The evaluation of one version as a Prefect task run: played on the actors' Dask
cluster, recorded in the run directory, and materialized as an asset downstream of the
version's checkpoint, so the lineage reads spec -> version -> checkpoint -> eval score.

Retried by Prefect (`eval.retries`); its caller logs a final failure and goes on: an
evaluation never fails training.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from distributed import Client
from prefect.assets import Asset, AssetProperties, materialize
from prefect.cache_policies import NO_CACHE

from tasks.buffer.channels import SCHEDULER_TIMEOUT_S
from tasks.eval.play import EvalSetup, play_eval
from tasks.eval.results import record_eval, result_path
from tasks.records.artifacts import asset_key

RESULT_TIMEOUT_S = 900.0  # an evaluation queued behind others on busy workers, then played


@dataclasses.dataclass(frozen=True)
class EvalTarget:
    """Which version to evaluate, and where its results go."""

    run_name: str
    run_dir: Path
    version: int
    step: int
    checkpoint: Path | None  # the version's checkpoint, if it has one


def evaluate_version(setup: EvalSetup, scheduler_address: str, target: EvalTarget, params_bytes: bytes) -> dict:
    """Evaluates `params_bytes` (the version's weights, safetensors) as a task run named
    `eval-v{N}`; returns its scores line (`tasks.eval.results`)."""
    path = result_path(target.run_dir, target.version)
    asset = Asset(key=asset_key(path), properties=AssetProperties(
        name=f"{target.run_name} v{target.version} eval",
        description=f"eval of version {target.version} (step {target.step}) on {len(setup.prompts)} held-out prompts"))
    upstream = target.checkpoint or target.run_dir / "spec.yaml"

    @materialize(asset, asset_deps=[asset_key(upstream)], cache_policy=NO_CACHE, persist_result=False,
                 task_run_name=f"eval-v{target.version}", retries=setup.eval.retries, retry_delay_seconds=2)
    def evaluate() -> dict:
        outcome = play_on_cluster(setup, scheduler_address, params_bytes, target.version)
        line = record_eval(target.run_dir, version=target.version, step=target.step,
                           checkpoint=target.checkpoint, outcome=outcome, params_bytes=params_bytes)
        asset.add_metadata(line)
        return line

    return evaluate()


def play_on_cluster(setup: EvalSetup, scheduler_address: str, params_bytes: bytes, version: int) -> dict:
    """`play_eval` on a worker of the cluster (beside its actor task: a local cluster's
    workers have a thread for such work), the weights sent to it directly."""
    with Client(scheduler_address, timeout=SCHEDULER_TIMEOUT_S, set_as_default=False) as client:
        data = client.scatter(params_bytes, direct=True)
        future = client.submit(play_eval, setup, data, version, pure=False)
        return future.result(timeout=RESULT_TIMEOUT_S)
