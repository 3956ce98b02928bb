"""Deployments: prefect.yaml as users deploy it (`prefect deploy --all`), a process worker,
and the spec parameter in each of its forms."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId
from prefect.deployments import run_deployment
from prefect.flows import load_flow_from_entrypoint

from flows.deploy import resolve_spec
from flows.spec import SpecError
from tasks.buffer.ledger import balanced
from tests.conftest import ROOT

PREFECT = str(Path(sys.executable).parent / "prefect")


def prefect_yaml() -> dict:
    return yaml.safe_load((ROOT / "prefect.yaml").read_text())


def test_every_spec_has_a_deployment_of_the_training_flow(shipped_models):
    deployments = prefect_yaml()["deployments"]
    specs = {f"specs/{p.name}" for p in (ROOT / "specs").glob("*.yaml")}
    assert {d["parameters"]["spec"] for d in deployments} == specs
    for deployment in deployments:
        assert Path(deployment["parameters"]["spec"]).stem == deployment["name"]
        flow = load_flow_from_entrypoint(str(ROOT / deployment["entrypoint"]))
        assert flow.name == "tandem-train"
        resolve_spec(str(ROOT / deployment["parameters"]["spec"]), [])
    assert len({yaml.safe_dump(d["work_pool"]) for d in deployments}) == 1  # one shared pool


def test_spec_parameter_is_a_path_yaml_text_or_a_mapping():
    path = ROOT / "specs" / "guess-number.yaml"
    from_path = resolve_spec(str(path), ["learner.steps=8"])
    assert from_path.learner.steps == 8
    assert resolve_spec(path.read_text(), ["learner.steps=8"]) == from_path
    assert resolve_spec(yaml.safe_load(path.read_text()), ["learner.steps=8"]) == from_path
    assert resolve_spec("{name: x}", []).name == "x"


def test_bad_spec_parameter_names_the_field_and_line():
    with pytest.raises(SpecError, match=r"learner\.steps \(line 3\): .*integer"):
        resolve_spec("name: x\nlearner:\n  steps: many\n", [])
    with pytest.raises(SpecError, match=r"env\.max_turnz \(line \d+\): unknown field"):
        resolve_spec({"name": "x", "env": {"max_turnz": 3}}, [])
    with pytest.raises(SpecError, match="cannot read"):
        resolve_spec("specs/no-such-spec.yaml", [])


@pytest.fixture
def process_worker(prefect_api, tmp_path):
    """The README's steps on the session's own server: the work pool prefect.yaml names,
    `prefect deploy --all`, and a process worker polling the pool; yields the pool's name."""
    pool = prefect_yaml()["deployments"][0]["work_pool"]["name"]
    for command in (["work-pool", "create", "--overwrite", "--type", "process", pool],
                    ["--no-prompt", "deploy", "--all"]):
        result = subprocess.run([PREFECT, *command], cwd=ROOT, capture_output=True, text=True)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    log = (tmp_path / "worker.log").open("w")
    # The worker's environment is a user's: without the test session's 8 virtual devices.
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"} | {"PREFECT_WORKER_QUERY_SECONDS": "1"}
    worker = subprocess.Popen([PREFECT, "worker", "start", "--pool", pool], cwd=tmp_path, env=env,
                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield pool
    finally:
        # A worker slow to stop (it waits on its runs' processes) must not outlive the test:
        # still polling the pool, it would take the next test's flow run.
        os.killpg(worker.pid, signal.SIGTERM)
        try:
            worker.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
        log.close()


@pytest.mark.slow  # 62 s on 2 cores: CI's time (README, "The two commands")
@pytest.mark.e2e
def test_deployed_spec_runs_on_a_process_worker(process_worker, tmp_path):
    spec = yaml.safe_load((ROOT / "specs" / "guess-number.yaml").read_text())
    spec["learner"] |= {"steps": 4, "batch_groups": 2}
    spec["buffer"]["capacity"] = 8
    spec["sync"]["interval"], spec["checkpoint"]["every"] = 4, 1  # one version, checkpointed
    spec["checkpoint"]["dir"] = str(tmp_path / "run")

    flow_run = run_deployment("tandem-train/guess-number", parameters={"spec": spec}, timeout=400)

    worker_log = (tmp_path / "worker.log").read_text()[-4000:]
    assert flow_run.state.is_completed(), f"{flow_run.state}\n{worker_log}"
    assert flow_run.work_queue_name == "default"
    with get_client(sync_client=True) as client:
        assert client.read_deployment(flow_run.deployment_id).work_pool_name == process_worker
        artifacts = client.read_artifacts(artifact_filter=ArtifactFilter(
            flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run.id])))
    by_key = {a.key: a for a in artifacts}
    assert {f"guess-number-{flow_run.name}-versions", "run-summary"} <= set(by_key)
    table = by_key[f"guess-number-{flow_run.name}-versions"].data
    (row,) = json.loads(table) if isinstance(table, str) else table
    assert (row["version"], row["step"]) == (1, 4)
    assert Path(row["checkpoint"]).is_dir()
    assert balanced(json.loads((tmp_path / "run" / "accounting.json").read_text()))


@pytest.mark.e2e
@pytest.mark.slow  # ~5 min on 2 cores; CI runs the deployed run above and the resume tests of test_train_e2e
def test_killed_flow_run_retried_from_prefect_continues_from_its_checkpoint(process_worker, tmp_path):
    import time

    import psutil

    run_dir = tmp_path / "run"
    spec = yaml.safe_load((ROOT / "specs" / "guess-number.yaml").read_text())
    spec["learner"] |= {"steps": 120, "batch_groups": 4, "stop_at_success": None}
    spec["buffer"]["capacity"] = 8
    spec["sync"]["interval"], spec["checkpoint"]["every"] = 4, 1  # a checkpoint every 4 steps
    spec["checkpoint"]["dir"] = str(run_dir)
    flow_run = run_deployment("tandem-train/guess-number", parameters={"spec": spec}, timeout=0)
    deadline = time.monotonic() + 300
    while not (run_dir / "checkpoints" / "2").exists():
        assert time.monotonic() < deadline, (tmp_path / "worker.log").read_text()[-3000:]
        time.sleep(0.5)
    # The flow's own process (the learner process's parent; the worker's runner above it
    # survives to report the crash) and all it started: its Dask cluster and learner.
    while not (run_dir / "learner.pid").exists():
        time.sleep(0.1)
    flow_process = psutil.Process(int((run_dir / "learner.pid").read_text())).parent()
    for process in [*flow_process.children(recursive=True), flow_process]:
        process.kill()
    with get_client(sync_client=True) as client:
        while not client.read_flow_run(flow_run.id).state.is_final():
            assert time.monotonic() < deadline + 120
            time.sleep(1)
        assert not client.read_flow_run(flow_run.id).state.is_completed()
        last = max(int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit())
        # The worker may also report its infrastructure's exit, seconds after the runner did;
        # a run retried before that report would be marked crashed again. Let it come.
        settle = time.monotonic() + 20
        while "infrastructure exited" not in (tmp_path / "worker.log").read_text() and time.monotonic() < settle:
            time.sleep(0.5)
        result = subprocess.run([PREFECT, "flow-run", "retry", str(flow_run.id)], cwd=ROOT,
                                capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr
        time.sleep(2)
        while not client.read_flow_run(flow_run.id).state.is_final():
            assert time.monotonic() < deadline + 900
            time.sleep(1)
        state = client.read_flow_run(flow_run.id).state
    assert state.is_completed(), (tmp_path / "worker.log").read_text()[-4000:]
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(1, 121))  # continued, nothing duplicated
    assert "resumed from" in (tmp_path / "worker.log").read_text() and last >= 2
    assert balanced(json.loads((run_dir / "accounting.json").read_text()))

