"""The training flow: the spec, compiled into one Prefect flow run that only wires tasks."""

from __future__ import annotations

from pathlib import Path

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from flows.report import publish_report
from flows.spec import Spec
from tasks.actors.cluster import actor_cluster
from tasks.runtime.task import learn


@task(cache_policy=NO_CACHE, persist_result=False)
def prepare_run_dir(spec: Spec) -> Path:
    """Creates the run directory and its resolved `spec.yaml`; a resumed run must keep its spec."""
    run_dir = spec.run_dir.resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    spec_file = run_dir / "spec.yaml"
    if spec_file.exists() and spec_file.read_text() != spec.to_yaml():
        get_run_logger().warning(f"{spec_file} differs from this run's spec; the run's spec is replaced")
    spec_file.write_text(spec.to_yaml())
    return run_dir


@flow(name="tandem-train", log_prints=True)
def train(spec: Spec) -> dict:
    """Trains the spec's agent: actors on Dask stream groups to the learner task."""
    run_dir = prepare_run_dir(spec)
    with actor_cluster(spec.actors) as address:
        result = learn(spec, address)
    publish_report(run_dir, run_name=spec.name, markdown=_summary(spec, run_dir, result))
    return result


def _summary(spec: Spec, run_dir: Path, result: dict) -> str:
    acc = result["accounting"]
    return (f"# {spec.name}\n\nFinished at step {result['step']}, version {result['version']}.\n\n"
            f"Run directory: `{run_dir}`\n\n| started | in flight | buffered | consumed | excluded |\n"
            f"|---|---|---|---|---|\n| {acc['started']} | {acc['in_flight']} | {acc['buffered']} | "
            f"{acc['consumed']} | {acc['excluded']} |\n")
