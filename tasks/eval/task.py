"""The evaluation of one version as a Prefect task run: played on the actors' Dask
cluster, recorded in the run directory, and materialized as an asset downstream of the
version's checkpoint, so the lineage reads spec -> version -> checkpoint -> eval score.

Retried by Prefect (`eval.retries`); its caller logs a final failure and goes on: an
evaluation never fails training.
"""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

from distributed import Client
from prefect.assets import Asset, AssetProperties, materialize
from prefect.cache_policies import NO_CACHE

from tasks.buffer.channels import SCHEDULER_TIMEOUT_S
from tasks.eval.play import EvalSetup, play_eval
from tasks.eval.results import record_eval, result_path
from tasks.placement import workers_with
from tasks.records.artifacts import asset_key
from tasks.run_dir import RunDir

RESULT_TIMEOUT_S = 900.0  # an evaluation queued behind others on busy workers, then played


@dataclasses.dataclass(frozen=True)
class EvalTarget:
    """Which version to evaluate, and where its results go."""

    run_name: str
    run_dir: Path
    version: int
    step: int
    checkpoint: Path | None  # the version's checkpoint, if it has one


class EvalCluster:
    """The actors' cluster as the evaluations of a run reach it: one Dask client for all
    of them, connected at the first. A client per evaluation cost a handshake with the
    scheduler each time, in the process that also serves the buffer."""

    def __init__(self, scheduler_address: str):
        self.address = scheduler_address
        self._client: Client | None = None
        self._lock = threading.Lock()

    def client(self) -> Client:
        with self._lock:
            if self._client is None:
                self._client = Client(self.address, timeout=SCHEDULER_TIMEOUT_S, set_as_default=False)
            return self._client

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None


def evaluate_version(setup: EvalSetup, cluster: EvalCluster, target: EvalTarget, params_bytes: bytes) -> dict:
    """Evaluates `params_bytes` (the version's weights, safetensors) as a task run named
    `eval-v{N}`; returns its scores line (`tasks.eval.results`)."""
    path = result_path(target.run_dir, target.version)
    asset = Asset(key=asset_key(path), properties=AssetProperties(
        name=f"{target.run_name} v{target.version} eval",
        description=f"eval of version {target.version} (step {target.step}) on {len(setup.prompts)} eval prompts"))
    upstream = target.checkpoint or RunDir(target.run_dir).spec

    @materialize(asset, asset_deps=[asset_key(upstream)], cache_policy=NO_CACHE, persist_result=False,
                 task_run_name=f"eval-v{target.version}", retries=setup.eval.retries, retry_delay_seconds=2)
    def evaluate() -> dict:
        outcome = play_on_cluster(setup, cluster, params_bytes, target.version)
        line = record_eval(target.run_dir, version=target.version, step=target.step,
                           checkpoint=target.checkpoint, outcome=outcome, params_bytes=params_bytes)
        asset.add_metadata(line)
        return line

    return evaluate()


def play_on_cluster(setup: EvalSetup, cluster: EvalCluster, params_bytes: bytes, version: int) -> dict:
    """`play_eval` on a worker of the cluster: one carrying `eval.resources`, or with none
    asked any (beside its actor task: a local cluster's workers have a thread for such
    work); the weights sent to it directly (unhashed: each version's are new, and hashing
    them cost the scheduler's process ~15 ms a time)."""
    client, resources = cluster.client(), dict(setup.eval.resources)
    workers = list(workers_with(client, resources)) if resources else None
    if resources and not workers:  # Dask would hold the task until one joins: say so, and retry
        raise RuntimeError(f"no Dask worker of {cluster.address} has the resources {resources} (eval.resources): "
                           f"start one with `dask worker {cluster.address} --resources "
                           f"{','.join(f'{k}={v:g}' for k, v in resources.items())}`")
    data = client.scatter(params_bytes, direct=True, hash=False, workers=workers)
    future = client.submit(play_eval, setup, data, version, pure=False, resources=resources or None)
    try:
        return future.result(timeout=RESULT_TIMEOUT_S)
    finally:
        future.release()
        data.release()
