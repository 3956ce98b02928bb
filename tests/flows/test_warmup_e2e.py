"""End to end: a warm-up, then RL from its weights, then `tandem eval` of version 0 (the
warm-up alone) beside the versions after it; and a run stopped in its warm-up (Ctrl-C),
resumed; and one killed in its warm-up, then in RL (real Prefect server, real Dask cluster,
the `tandem` CLI)."""

import json
import os
import signal
import subprocess
import time

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

from tasks.buffer.ledger import balanced
from tasks.run_dir import RunDir
from tests.conftest import ROOT, tandem
from tests.flows.conftest import flow_run_of
from tests.flows.test_interrupt_e2e import CTRL_C, TANDEM, Terminal

pytestmark = pytest.mark.e2e

WARMUP = "warmup={examples: 256, steps: 24, batch: 32, rows: 16, checkpoint_every: 8, optimizer: {lr: 0.003}}"
TINY = ["--set", WARMUP, "--set", "learner.steps=8", "--set", "learner.batch_groups=4", "--set", "buffer.capacity=8",
        "--set", "sync.interval=4", "--set", "checkpoint.every=1", "--set", "eval.n=32"]


def warmup_records(run_dir):
    return [json.loads(line) for line in RunDir(run_dir).warmup_metrics.read_text().splitlines()]


def test_warm_up_then_rl_then_eval_with_version_0_upstream(prefect_api, tmp_path):
    run_dir = tmp_path / "run"
    result = tandem("run", "specs/calculator.yaml", *TINY, "--set", f"checkpoint.dir={run_dir}")
    assert result.returncode in (0, 3), result.stdout[-3000:] + result.stderr[-3000:]  # 3: short of the target
    assert "Finished at step 8, version 2" in result.stdout, result.stdout[-2000:]

    rows = warmup_records(run_dir)
    assert [r["step"] for r in rows] == list(range(1, 25))
    assert [r["cursor"] for r in rows] == [[32 * k, 32 * (k + 1)] for k in range(24)]
    assert rows[-1]["nll"] < rows[0]["nll"] / 2
    assert RunDir(run_dir).warmed_up() == RunDir(run_dir).warmup_checkpoints / "24"
    accounting = json.loads((run_dir / "accounting.json").read_text())
    assert balanced(accounting) and accounting["consumed"] == 8 * 4

    with get_client(sync_client=True) as client:
        flow_run = flow_run_of(client, run_dir)
        tasks = {t.name: t for t in client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run.id])))}
        assert {"version-0-warm-up", "version-1", "version-2"} <= set(tasks)
        (warm_up,) = [t for name, t in tasks.items() if name.startswith("warm-up-")]
        (learner,) = [t for name, t in tasks.items() if name.startswith("learner-")]
        assert warm_up.state.is_completed()
        # Version 0 is materialized by the warm-up, as it ends; the learner starts after both.
        assert warm_up.start_time <= tasks["version-0-warm-up"].start_time <= warm_up.end_time <= learner.start_time

    evaluated = tandem("eval", str(run_dir), "--all")
    assert evaluated.returncode == 0, evaluated.stdout[-3000:] + evaluated.stderr[-3000:]
    scores = {s["version"]: s for s in map(json.loads, (run_dir / "eval/scores.jsonl").read_text().splitlines())}
    assert set(scores) == {0, 1, 2}
    # A random policy wins 9.1% of calculator episodes (README, "Environments"); 24 updates on
    # the expert's demonstrations (call the tool, answer its result) won 47% of 32 (greedy).
    assert scores[0]["success_rate"] >= 0.25, scores[0]


@pytest.mark.slow
def test_a_run_stopped_in_its_warm_up_resumes_it_and_reads_each_demonstration_once(prefect_api, tmp_path):
    run_dir = tmp_path / "run"
    slow_warmup = WARMUP.replace("steps: 24", "steps: 400").replace("checkpoint_every: 8", "checkpoint_every: 50")
    terminal = Terminal([TANDEM, "run", "specs/calculator.yaml", *TINY, "--set", slow_warmup,
                         "--set", f"checkpoint.dir={run_dir}"], env={})
    deadline = time.monotonic() + 240
    while not (RunDir(run_dir).warmup_metrics.exists() and len(warmup_records(run_dir)) >= 20):
        assert time.monotonic() < deadline and terminal.process.poll() is None, terminal.output[-3000:]
        time.sleep(0.2)
    terminal.press(CTRL_C)
    assert terminal.wait(60) == 130, terminal.output[-3000:]
    assert "resumes from its warm-up's checkpoint of update" in terminal.output, terminal.output[-2000:]
    stopped_at = len(warmup_records(run_dir))
    assert 20 <= stopped_at < 400

    result = tandem("resume", str(run_dir), "--set", "learner.steps=4")
    assert result.returncode in (0, 3), result.stdout[-3000:] + result.stderr[-3000:]
    rows = warmup_records(run_dir)
    assert [r["step"] for r in rows] == list(range(1, 401))
    assert [r["cursor"] for r in rows] == [[32 * k, 32 * (k + 1)] for k in range(400)]
    assert RunDir(run_dir).warmed_up() == RunDir(run_dir).warmup_checkpoints / "400"


def _killed_when(command: list[str], ready, deadline_s: float = 240) -> None:
    """Runs `command` in a session of its own and SIGKILLs all of it once `ready()`."""
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    deadline = time.monotonic() + deadline_s
    while not ready():
        assert process.poll() is None and time.monotonic() < deadline, "ended before it could be killed"
        time.sleep(0.2)
    os.killpg(process.pid, signal.SIGKILL)  # the CLI, the warm-up or learner process, the Dask cluster
    process.wait()


@pytest.mark.slow
def test_a_run_killed_in_its_warm_up_and_then_in_rl_loses_nothing_and_trains_nothing_twice(prefect_api, tmp_path):
    run_dir = tmp_path / "run"
    warm = WARMUP.replace("steps: 24", "steps: 60")
    command = [TANDEM, "run", "specs/calculator.yaml", *TINY, "--set", warm, "--set", "learner.steps=40",
               "--set", f"checkpoint.dir={run_dir}"]
    checkpoints = RunDir(run_dir).warmup_checkpoints
    _killed_when(command, lambda: checkpoints.is_dir() and any(p.name == "16" for p in checkpoints.iterdir()))
    _killed_when([TANDEM, "resume", str(run_dir)], lambda: (run_dir / "checkpoints" / "3").exists())
    result = tandem("resume", str(run_dir))
    assert result.returncode in (0, 3), result.stdout[-3000:] + result.stderr[-3000:]

    rows = warmup_records(run_dir)
    assert [r["step"] for r in rows] == list(range(1, 61))
    assert [r["cursor"] for r in rows] == [[32 * k, 32 * (k + 1)] for k in range(60)]
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [m["step"] for m in metrics if "eval" not in m]
    assert steps == list(range(1, steps[-1] + 1))  # replaced after the kill, not duplicated
    accounting = json.loads((run_dir / "accounting.json").read_text())
    assert balanced(accounting) and accounting["consumed"] == steps[-1] * 4
