"""Faults survived, with real processes: a learner killed, a Dask worker killed, an
environment that hangs. (A disk filling mid-checkpoint: tests/tasks/test_checkpoint.py;
a whole run killed and resumed: test_train_e2e.py.)"""

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tasks.buffer.ledger import balanced
from tests.conftest import ROOT

pytestmark = pytest.mark.e2e

BASE = ["--set", "learner.batch_groups=4", "--set", "buffer.capacity=8", "--set", "sync.interval=4"]


def start_run(run_dir, *overrides):
    command = [os.path.join(os.path.dirname(sys.executable), "tandem"), "run", "specs/guess-number.yaml",
               *BASE, "--set", f"checkpoint.dir={run_dir}", *overrides]
    log = open(run_dir.parent / "run.log", "w")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True), run_dir.parent / "run.log"


def wait_for(predicate, process, timeout=240):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert process.poll() is None, "the run ended too early"
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def finish(process, log, timeout=400):
    try:
        code = process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        raise
    assert code == 0, log.read_text()[-4000:]
    return log.read_text()


def records(run_dir):
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return metrics, json.loads((run_dir / "accounting.json").read_text())


def test_killed_learner_is_retried_by_prefect_and_resumes(prefect_api, tmp_path):
    run_dir, steps = tmp_path / "run", 24
    process, log = start_run(run_dir, "--set", f"learner.steps={steps}")
    wait_for(lambda: (run_dir / "checkpoints" / "2").exists() and (run_dir / "learner.pid").exists(), process)
    os.kill(int((run_dir / "learner.pid").read_text()), signal.SIGKILL)
    output = finish(process, log)

    assert "learner process died" in output and "resumed from" in output
    metrics, accounting = records(run_dir)
    assert [m["step"] for m in metrics] == list(range(1, steps + 1))
    assert accounting["consumed"] == steps * 4 and balanced(accounting)  # none twice, none lost


def test_killed_worker_is_replaced_and_its_prompts_regenerated(prefect_api, tmp_path):
    run_dir, steps = tmp_path / "run", 32
    # Slow steps keep every actor inside a group, so the killed one surely holds an attempt.
    process, log = start_run(run_dir, "--set", f"learner.steps={steps}", "--set", "env.latency_s=0.05")
    wait_for(lambda: (run_dir / "checkpoints" / "1").exists(), process)
    learner = int((run_dir / "learner.pid").read_text())
    workers = [p for p in psutil.Process(process.pid).children(recursive=True)
               if p.pid != learner and "multiprocessing" in " ".join(p.cmdline())
               and "resource_tracker" not in " ".join(p.cmdline())]
    assert workers, "no Dask worker process found"
    workers[0].kill()
    output = finish(process, log)

    metrics, accounting = records(run_dir)
    assert [m["step"] for m in metrics] == list(range(1, steps + 1))
    assert accounting["consumed"] == steps * 4 and balanced(accounting)
    assert accounting["excluded"].get("lost", 0) >= 1 and accounting["retried"] >= 1, accounting
    assert "is lost" in output or "lost with its worker" in output


def test_hanging_environment_times_out_and_its_prompt_is_retried(prefect_api, tmp_path):
    run_dir, steps = tmp_path / "run", 8
    (tmp_path / "markers").mkdir()
    process, log = start_run(
        run_dir, "--set", f"learner.steps={steps}", "--set", "env.entrypoint=tests.support.fault_envs:HangsOnce",
        "--set", f"env.kwargs={{marker_dir: {tmp_path / 'markers'}, hang_s: 3}}", "--set", "env.episode_timeout_s=1")
    output = finish(process, log)

    metrics, accounting = records(run_dir)
    assert [m["step"] for m in metrics] == list(range(1, steps + 1))
    assert accounting["excluded"]["aborted"] >= 1 and accounting["retried"] >= 1 and balanced(accounting)
    assert "timeout after 1.0s" in output
