"""End to end: the `tandem` CLI, a real Prefect server, a real Dask LocalCluster."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey, FlowRunFilter,
                                            FlowRunFilterId)

from tasks.buffer.ledger import balanced
from tests.conftest import ROOT, tandem
from tests.flows.conftest import TINY, flow_run_of

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("tiny_run")]  # one worker builds the run they read


def run_dir_records(run_dir):
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    accounting = json.loads((run_dir / "accounting.json").read_text())
    return metrics, accounting


def quiet(result: subprocess.CompletedProcess) -> None:
    """A normal end: a few lines (no per-version or Dask chatter), nothing red, no traceback."""
    output = result.stdout + result.stderr
    assert len(output.splitlines()) <= 30, output
    for alarming in ("ERROR", "Traceback", "CommClosedError"):
        assert alarming not in output, output


def test_run_trains_checkpoints_and_reports_to_prefect(tiny_run):
    run_dir, result = tiny_run
    assert "Prefect UI: http://127.0.0.1:" in result.stdout
    assert "Finished at step 12, version 3" in result.stdout
    quiet(result)

    versions = sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit())
    assert versions == [1, 2, 3]
    metrics, accounting = run_dir_records(run_dir)
    metrics = [m for m in metrics if "eval" not in m]  # versions 2 and 3 are evaluated too
    assert [m["step"] for m in metrics] == list(range(1, 13))
    assert [m["version"] for m in metrics] == [0] * 4 + [1] * 4 + [2] * 4
    for field in ("reward_mean", "learner_busy", "buffer_depth", "excluded", "compiles", "padding",
                  "time", "success_rate"):
        assert field in metrics[-1]
    assert metrics[-1]["compiles"] == 1
    assert balanced(accounting) and accounting["consumed"] == 12 * 4
    assert (run_dir / "spec.yaml").exists()

    with get_client(sync_client=True) as client:
        flow_run = flow_run_of(client, run_dir)
        assert flow_run.state.is_completed()
        task_names = {t.name for t in client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run.id])))}
        assert any(n.startswith("learner") for n in task_names)
        assert {"version-1", "version-2", "version-3"} <= task_names
        artifacts = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(like_="-versions")))
        rows = [json.loads(a.data) if isinstance(a.data, str) else a.data for a in artifacts]
        assert any([r["version"] for r in table] == [1, 2, 3] and [r["step"] for r in table] == [4, 8, 12]
                   for table in rows)
        (progress,) = client.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=["learner-progress"]), flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run.id])))
        assert (progress.data, progress.description) == (100.0, "guess-number: finished at step 12 of 12, version 3")


@pytest.mark.slow  # 57 s on 2 cores: CI's time (README, "The two commands")
def test_killed_run_resumes_from_its_last_version(prefect_api, tmp_path):
    run_dir = tmp_path / "run"
    command = [str(os.path.join(os.path.dirname(sys.executable), "tandem")), "run", "specs/guess-number.yaml",
               *TINY, "--set", "learner.steps=400", "--set", f"checkpoint.dir={run_dir}"]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    deadline = time.monotonic() + 240
    while not (run_dir / "checkpoints" / "2").exists() and time.monotonic() < deadline:
        assert process.poll() is None, "the run ended before it could be killed"
        time.sleep(0.2)
    os.killpg(process.pid, signal.SIGKILL)  # the CLI, its Dask cluster, everything
    process.wait()

    checkpoints = run_dir / "checkpoints"
    last = max(int(p.name) for p in checkpoints.iterdir() if p.name.isdigit())
    target = (last + 2) * 4
    result = tandem("resume", str(run_dir), "--set", f"learner.steps={target}")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"step {last * 4}, version {last}" in result.stdout + result.stderr
    quiet(result)

    metrics, accounting = run_dir_records(run_dir)
    assert [m["step"] for m in metrics] == list(range(1, target + 1))  # replaced, not duplicated
    assert metrics[-1]["version"] == last + 1
    assert max(int(p.name) for p in checkpoints.iterdir() if p.name.isdigit()) == last + 2
    # Groups consumed after the last checkpoint were lost with the crash and drawn again:
    # the resumed run's accounting counts exactly one batch per step.
    assert balanced(accounting) and accounting["consumed"] == target * 4


@pytest.mark.slow  # 29-39 s on 2 cores: CI's time (README, "The two commands")
def test_sync_mode_trains_every_batch_on_the_weights_it_was_played_with(prefect_api, tmp_path):
    """The synchronous baseline: play a batch with the latest weights, train it for its
    steps (2 epochs here), publish once, repeat. No group is ever stale."""
    run_dir = tmp_path / "run"
    result = tandem("run", "specs/guess-number.yaml", "--set", "learner.mode=sync", "--set", "learner.epochs=2",
                    "--set", "sync.interval=2", "--set", "learner.batch_groups=4", "--set", "learner.steps=8",
                    "--set", f"checkpoint.dir={run_dir}")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    metrics, accounting = run_dir_records(run_dir)
    assert [m["version"] for m in metrics] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert all(m["staleness_max"] == 0 for m in metrics)
    batches = [m["prompt_ids"] for m in metrics]
    assert batches[0::2] == batches[1::2] and len({tuple(b) for b in batches}) == 4  # each batch twice
    assert balanced(accounting) and accounting["consumed"] == 4 * 4
