"""End to end: versions evaluated during a run (real Prefect server, real Dask cluster),
then again after the fact with `tandem eval`, and their episodes shown with `tandem show`."""

import json
import shutil
import time

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey, FlowRunFilter,
                                            FlowRunFilterId)
from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter

from tasks.run_dir import RunDir
from tests.conftest import ROOT, tandem
from tests.flows.conftest import flow_run_of
from tests.flows.test_interrupt_e2e import CTRL_C, TANDEM, Terminal

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("tiny_run")]  # one worker builds the run they read


def scores(run_dir):
    return [json.loads(line) for line in (run_dir / "eval/scores.jsonl").read_text().splitlines()]


def without_times(line):
    return {k: v for k, v in line.items() if k not in ("time", "eval_s")}


@pytest.fixture
def evaluated_run(tiny_run):
    """The session's small run (tests/flows/conftest.py), evaluated during the run."""
    output = tiny_run.result.stdout + tiny_run.result.stderr
    assert "ERROR" not in output and "eval of version" not in output  # routine: in Prefect's logs only
    assert "Best version by eval score: " in tiny_run.result.stdout
    return tiny_run.run_dir


def test_every_second_version_and_the_last_are_evaluated_and_recorded(evaluated_run):
    run_dir = evaluated_run
    assert [s["version"] for s in scores(run_dir)] == [2, 3]  # every 2nd, and the last
    assert all(s["prompts"] == s["episodes"] == 12 for s in scores(run_dir))
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [(m["version"], m["step"]) for m in metrics if "eval" in m] == [(2, 8), (3, 12)]
    assert len((run_dir / "episodes/eval/v3.jsonl").read_text().splitlines()) == 12
    assert any((run_dir / "episodes").glob("v*.jsonl"))  # training's sample
    assert list((run_dir / "tensorboard/eval").glob("events.out.tfevents.*"))

    with get_client(sync_client=True) as client:
        flow_run = flow_run_of(client, run_dir)
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run.id])))
        evals = {t.name: t.state.type.value for t in runs if t.name.startswith("eval-v")}
        assert evals == {"eval-v2": "COMPLETED", "eval-v3": "COMPLETED"}
        table = max(client.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(like_="-versions"), flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run.id]))),
            key=lambda artifact: artifact.created)  # the latest: each refresh is a new one
        rows = json.loads(table.data) if isinstance(table.data, str) else table.data
        assert [r["version"] for r in rows if r["eval_success_rate"] is not None] == [2, 3]
        (summary,) = client.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=["run-summary"]), flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run.id])))
        assert "Best version by eval score" in summary.data and "agent:" in summary.data


def materializations(run_dir, wanted: int) -> dict[str, dict]:
    """The run's asset materializations, by asset key: {"upstream": [keys], "metadata": {...}}.
    Events reach the server a moment after the task ends: waits for `wanted` of them."""
    name = EventNameFilter(name=["prefect.asset.materialization.succeeded"])
    resource = EventResourceFilter(id_prefix=[run_dir.resolve().as_uri()])
    deadline = time.monotonic() + 30
    with get_client(sync_client=True) as client:
        while True:
            events = client.read_events(EventFilter(event=name, resource=resource), limit=50).events
            if len(events) >= wanted or time.monotonic() > deadline:
                return {e.resource.id: {"upstream": sorted(r.id for r in e.related if r.role == "asset"),
                                        "metadata": e.payload} for e in events}
            time.sleep(1)


def test_the_lineage_reads_spec_version_checkpoint_eval(evaluated_run):
    run_dir = evaluated_run
    assets = materializations(run_dir, wanted=5)  # versions 1-3, evals of 2 and 3
    versions = {a["metadata"]["version"]: key for key, a in assets.items() if "/eval/" not in key}
    evals = {a["metadata"]["version"]: key for key, a in assets.items() if "/eval/" in key}
    assert sorted(versions) == [1, 2, 3] and sorted(evals) == [2, 3]
    spec = (run_dir / "spec.yaml").resolve().as_uri()
    assert assets[versions[1]]["upstream"] == [spec]
    for v in (2, 3):  # spec -> v1 -> v2 -> v3, and each evaluated version -> its eval
        assert assets[versions[v]]["upstream"] == sorted([spec, versions[v - 1]])
        assert assets[evals[v]]["upstream"] == [versions[v]]
        assert assets[evals[v]]["metadata"]["success_rate"] == scores(run_dir)[v - 2]["success_rate"]


def test_eval_after_the_fact_repeats_the_greedy_scores_and_episodes(evaluated_run, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(evaluated_run, run_dir)  # the session's run stays as other tests read it
    during = scores(run_dir)[-1]
    episodes = (run_dir / "episodes/eval/v3.jsonl").read_text()
    result = tandem("eval", str(run_dir), "--version", "3")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    after = scores(run_dir)[-1]
    assert after["checkpoint"] == str(run_dir / "checkpoints" / "3")  # the copy's own
    assert without_times(after) | {"checkpoint": None} == without_times(during) | {"checkpoint": None}
    assert (run_dir / "episodes/eval/v3.jsonl").read_text() == episodes
    assert "| 3" in result.stdout and (run_dir / "eval/table.md").exists()
    assert tandem("eval", str(run_dir), "--set", "learner.steps=4").returncode == 2  # only eval.* fields


def test_show_prints_transcripts(evaluated_run):
    result = tandem("show", str(evaluated_run), "--eval", "--version", "3", "--limit", "1")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("v3 · prompt 0") and lines[1].startswith("  prompt: 'secret=")
    assert lines[2] == "  env:    ':'" and lines[3].startswith("  agent:  '") and lines[3].endswith("(v3)")
    failed = tandem("show", str(evaluated_run), "--failed")
    assert failed.returncode == 0 and "failed training episodes of version" in failed.stdout
    assert tandem("show", str(evaluated_run), "--version", "999").returncode == 1


@pytest.mark.slow  # trains the demo to its target: ~2 min on 2 cores
def test_greedy_eval_of_a_trained_policy_scores_at_least_its_sampled_training_success(prefect_api, tmp_path):
    run_dir = tmp_path / "run"
    # Only the last version is evaluated (every one of the 12 secrets, greedily).
    result = tandem("run", "specs/guess-number.yaml", "--set", "eval.every=100000",
                    "--set", f"checkpoint.dir={run_dir}")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    steps = [m for m in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if "eval" not in m]
    training_success = sum(m["success_rate"] for m in steps[-20:]) / 20  # what `stop_at_success` reads
    assert training_success >= 0.95
    (last,) = scores(run_dir)
    assert last["step"] == steps[-1]["step"] and last["prompts"] == 12
    assert last["success_rate"] >= training_success


def test_ctrl_c_during_tandem_eval_exits_130_without_a_traceback(evaluated_run, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(evaluated_run, run_dir)  # the session's run stays as other tests read it
    terminal = Terminal([TANDEM, "eval", str(run_dir), "--all"], env={"COLUMNS": "160", "PYTHONPATH": str(ROOT)})
    deadline = time.monotonic() + 120
    while "Beginning flow run" not in terminal.output:  # its Dask cluster starts next, then the evaluations
        assert terminal.process.poll() is None and time.monotonic() < deadline, terminal.output[-3000:]
        time.sleep(0.1)
    pressed = time.monotonic()
    terminal.press(CTRL_C)
    code = terminal.wait(timeout=60)
    assert code == 130 and time.monotonic() - pressed <= 10, terminal.output[-3000:]
    assert "Interrupted (Ctrl-C)" in terminal.output and "Traceback" not in terminal.output, terminal.output[-3000:]


def test_steps_come_from_checkpoints_after_a_resume_that_changed_sync_interval(evaluated_run, tmp_path):
    """Versions 1-3 at steps 4, 8, 12 (sync.interval 4); resumed at interval 2, versions 4
    and 5 are steps 14 and 16, not version × interval (8 and 10, or 16 and 20)."""
    run_dir = tmp_path / "run"
    shutil.copytree(evaluated_run, run_dir)
    resumed = tandem("resume", str(run_dir), "--set", "sync.interval=2", "--set", "learner.steps=16",
                     "--set", "eval.every=null")
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    evaluated = tandem("eval", str(run_dir), "--version", "5")
    assert evaluated.returncode == 0, evaluated.stdout[-3000:] + evaluated.stderr[-3000:]
    assert {s["version"]: s["step"] for s in scores(run_dir)}[5] == 16
    assert [RunDir(run_dir).checkpoint_step(v) for v in (3, 4, 5)] == [12, 14, 16]
    again = tandem("resume", str(run_dir))  # at learner.steps already: it says where it is, and ends
    assert "checkpoint of version 5 (step 16)" in again.stdout, again.stdout + again.stderr
