"""Faults survived, with real processes: a learner killed, a Dask worker killed, an
environment that hangs. (A disk filling mid-checkpoint: tests/tasks/test_checkpoint.py;
a whole run killed and resumed: test_train_e2e.py.)"""

import importlib
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

BASE = ["--set", "learner.batch_groups=4", "--set", "buffer.capacity=8", "--set", "sync.interval=4",
        "--set", "checkpoint.every=1"]


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


@pytest.mark.slow  # 65 s on 2 cores: CI's time (README, "The two commands")
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


@pytest.mark.slow  # 51 s on 2 cores: CI's time (README, "The two commands")
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
    assert "attempts it held are lost" in output or "lost with its worker" in output


@pytest.mark.slow  # 44 s on 2 cores: CI's time (README, "The two commands")
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


@pytest.mark.slow  # 63 s on 2 cores: CI's time (README, "The two commands")
@pytest.mark.timeout(420)
def test_a_failure_relaying_to_prefect_stops_the_actors_and_the_retry_trains(prefect_api, dask_cluster, tmp_path,
                                                                            monkeypatch):
    """The reviewer's run: a Prefect API error while recording a version failed the task; its
    learner ran on for 30 s and was killed with no cleanup, its actors kept their worker
    threads (one each here), and the retried learner waited forever for groups."""
    from distributed import Client
    from prefect import flow

    from flows.spec import load_spec
    from tasks.runtime.processes import task as task_module
    from tasks.runtime.processes import task_records

    recorded = []

    def flaky_record_version(**fields):
        recorded.append(fields["version"])
        if len(recorded) == 1:
            raise RuntimeError("Prefect API: 503 Service Unavailable")
        if len(recorded) == 3:  # the retried learner has trained on: ends the test's run, not retried
            raise task_module.Unrecoverable("enough: the retried learner trains")

    monkeypatch.setattr(task_records, "record_version", flaky_record_version)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    spec = load_spec(ROOT / "specs/guess-number.yaml", [o for o in BASE if o != "--set"] + [
        "learner.steps=100000", "checkpoint.keep=3", "actors.workers=2", f"checkpoint.dir={run_dir}"])

    @flow
    def train_with_flaky_api():
        return task_module.learn(spec, dask_cluster)

    state = train_with_flaky_api(return_state=True)
    assert "enough: the retried learner trains" in state.message, state.message
    assert len(recorded) == 3 and recorded[2] > recorded[1]  # two versions trained after the retry resumed
    with Client(dask_cluster) as client:  # no session's actors left on the workers
        sessions = client.run(lambda: sorted(importlib.import_module("tasks.actors.actor")._SHARED))
    assert sessions and all(running == [] for running in sessions.values()), sessions


def test_observations_outside_the_alphabet_stop_the_run_with_one_clear_error(prefect_api, tmp_path):
    """Every attempt aborts (guess-number's first observation, ":", is left out of the
    alphabet): prompts retried, new ones drawn; the learner used to wait forever."""
    run_dir = tmp_path / "run"
    started = time.monotonic()
    process, log = start_run(run_dir, "--set", "learner.steps=8", "--set", "model.tokenizer.alphabet=abcdefghijkl<>=?")
    try:
        code = process.wait(timeout=180)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    output = log.read_text()
    assert code == 1, output[-4000:]
    assert time.monotonic() - started < 120, "it took over two minutes"
    assert "outside the tokenizer's alphabet: ':'" in output and "model.tokenizer.alphabet" in output
    assert "resumed from" not in output and output.count("learner session") <= 1, "the learner task was retried"
    # Once, in a few lines, no traceback: the whole of it is in the run's log (README, "The run directory").
    assert "Traceback" not in output and output.count("No retry can fix this") == 1, output[-4000:]
    failure = output[output.index("run failed:"):].splitlines()
    assert len(failure) <= 5 and str(run_dir / "tandem.log") in failure[-1], failure
    assert "Traceback" in (run_dir / "tandem.log").read_text()


@pytest.mark.slow  # 74 s on 2 cores: CI's time (README, "The two commands")
def test_a_torn_metrics_line_and_a_damaged_checkpoint_are_survived_on_resume(prefect_api, tmp_path):
    """A disk that filled (or a power loss) tore the last line of metrics.jsonl and cut the
    latest checkpoint's array short; every resume used to fail."""
    run_dir = tmp_path / "run"
    process, log = start_run(run_dir, "--set", "learner.steps=12")
    finish(process, log)
    with (run_dir / "metrics.jsonl").open("a") as f:
        f.write('{"step": 13, "reward_mean": 0.')
    array = max((p for p in (run_dir / "checkpoints" / "3" / "state").rglob("*") if p.is_file()),
                key=lambda p: p.stat().st_size)
    with array.open("r+b") as f:
        f.truncate(100)

    process, log = start_run(run_dir, "--set", "learner.steps=16")
    output = finish(process, log)
    assert "metrics.jsonl line 13 is torn" in output
    assert "checkpoint 3 is damaged" in output and "Resuming from version 2" in output
    metrics, accounting = records(run_dir)
    assert [m["step"] for m in metrics] == list(range(1, 17))
    assert accounting["consumed"] == 16 * 4 and balanced(accounting)
    assert sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit()) == [1, 2, 3, 4]
