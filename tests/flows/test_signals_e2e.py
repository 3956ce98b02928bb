"""Signals from outside, as a scheduler or a user sends them to `tandem run` (README, "Ctrl-C"
and "Faults"): SIGTERM (Slurm, Kubernetes, `timeout`) stops the run on a checkpoint, as a
first Ctrl-C does; SIGKILL leaves no process of the run behind; a Ctrl-C during start-up
ends the run within seconds."""

import json
import os
import re
import signal
import sys
import time

import psutil
import pytest
from prefect.client.orchestration import get_client

from tasks.run_dir import RunDir
from tasks.runtime.processes.task import run_dir_locked
from tasks.buffer.ledger import balanced
from tests.conftest import tandem
from tests.flows.test_interrupt_e2e import CTRL_C, TANDEM, TINY, Terminal, left_behind, metrics, wait_for_version

pytestmark = pytest.mark.e2e


def steps(run_dir) -> list[int]:
    return [json.loads(line)["step"] for line in metrics(run_dir)]


# A stand-in for the user's shell, which leads the terminal's session: were `tandem run` the
# leader, the kernel would hang up (SIGHUP) every process of the terminal as it ended, and
# hide those that outlive it. Like a shell, it ignores Ctrl-C, says how its command ended,
# and stays at its prompt.
SHELL = ("import signal, subprocess, sys\n"
         "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
         "code = subprocess.call(sys.argv[1:], preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))\n"
         "print(f'[exit {code if code >= 0 else 128 - code}]', flush=True)\n"
         "sys.stdin.read()\n")


class Shell(Terminal):
    """`tandem run` from a shell in a terminal, its environment marked: every process it
    starts inherits the mark, wherever it is reparented once `tandem run` has gone."""

    def __init__(self, run_dir):
        super().__init__([sys.executable, "-c", SHELL, TANDEM, "run", "specs/guess-number.yaml", *TINY,
                          "--set", "learner.steps=400", "--set", f"checkpoint.dir={run_dir}"],
                         env={"XLA_FLAGS": "", "COLUMNS": "160", "TANDEM_TEST_RUN": str(run_dir)})
        while not (children := psutil.Process(self.process.pid).children()):
            assert self.process.poll() is None, self.output[-3000:]
            time.sleep(0.01)
        self.tandem = children[0].pid  # `tandem run`

    def exit_status(self, timeout: float) -> int:
        """Of `tandem run`, as the shell says it."""
        deadline = time.monotonic() + timeout
        while (said := re.search(r"\[exit (\d+)\]", self.output)) is None:
            assert time.monotonic() < deadline, f"still running: {self.output[-3000:]}"
            time.sleep(0.02)
        return int(said.group(1))

    def close(self) -> None:
        self.process.kill()
        self.wait(timeout=10)


@pytest.fixture
def shell():
    """Starts `Shell`s; closes them after the test."""
    started = []
    yield lambda run_dir: started.append(Shell(run_dir)) or started[-1]
    for each in started:
        each.close()


def processes_of(run_dir) -> list[psutil.Process]:
    """Every process of the run: `tandem run`, the learner, the Dask workers, multiprocessing's
    resource tracker (the Prefect server is the test's own; the shell is not the run's)."""
    found = []
    for process in psutil.process_iter():
        try:
            if (process.environ().get("TANDEM_TEST_RUN") == str(run_dir) and process.status() != psutil.STATUS_ZOMBIE
                    and process.cmdline()[1:3] != ["-c", SHELL]):
                found.append(process)
        except psutil.Error:
            continue
    return found


def still_running(run_dir, within_s: float) -> list[str]:
    """The run's processes but the shell still running after `within_s` seconds."""
    started = time.monotonic()
    while (alive := processes_of(run_dir)) and time.monotonic() < started + within_s:
        time.sleep(0.1)
    return [" ".join(p.cmdline())[:120] for p in alive]


def wait_for_output(terminal: Shell, text: str, timeout=120) -> None:
    deadline = time.monotonic() + timeout
    while text not in terminal.output:
        assert terminal.process.poll() is None, terminal.output[-3000:]
        assert time.monotonic() < deadline, f"no {text!r}: {terminal.output[-3000:]}"
        time.sleep(0.02)


def flow_run_state(run_dir):
    with get_client(sync_client=True) as client:
        runs = [r for r in client.read_flow_runs() if str(run_dir) in json.dumps(r.parameters.get("spec"))]
    return [r.state.type.value for r in sorted(runs, key=lambda r: r.created)]


def resume_to(run_dir, target: int):
    result = tandem("resume", str(run_dir), "--set", f"learner.steps={target}", env={"XLA_FLAGS": ""})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


@pytest.mark.parametrize("to", [
    pytest.param("tandem run", marks=pytest.mark.slow),  # as `timeout` and Kubernetes send it (72 s: CI's time)
    pytest.param("every process", marks=pytest.mark.slow),  # as a Slurm job step does (~100 s on 2 busy cores)
])
def test_sigterm_stops_on_a_checkpoint_and_resume_continues(prefect_api, tmp_path, shell, to):
    run_dir = tmp_path / "run"
    terminal = shell(run_dir)
    wait_for_version(run_dir, 1, terminal)
    before = RunDir(run_dir).latest_version()
    sent = time.monotonic()
    for process in processes_of(run_dir) if to == "every process" else [psutil.Process(terminal.tandem)]:
        process.send_signal(signal.SIGTERM)
    code = terminal.exit_status(timeout=60)
    seconds, output = time.monotonic() - sent, terminal.output

    assert code == 143, output[-3000:]
    print(f"exited {seconds:.1f}s after SIGTERM")
    assert seconds < 15, f"exited {seconds:.1f}s after SIGTERM"
    for noise in ("Traceback", "ERROR", "leaked"):
        assert noise not in output, output[-3000:]
    assert left_behind(run_dir) == [] and not run_dir_locked(run_dir)
    version = RunDir(run_dir).latest_version()
    assert version >= before and steps(run_dir) == list(range(1, version * 4 + 1))  # all it trained: checkpointed
    assert "Interrupted (SIGTERM)" in output and "Resume with:" in output, output[-3000:]
    assert flow_run_state(run_dir) == ["CANCELLED"]

    trained = metrics(run_dir)
    target = version * 4 + 8
    resume_to(run_dir, target)
    assert metrics(run_dir)[:len(trained)] == trained and steps(run_dir) == list(range(1, target + 1))
    accounting = json.loads((run_dir / "accounting.json").read_text())
    assert balanced(accounting) and accounting["consumed"] == target * 4  # none lost, none twice


@pytest.mark.slow  # 100 s on 2 busy cores, the slowest here: CI's time (README, "The two commands")
def test_sigkill_leaves_no_process_and_the_next_resume_succeeds_at_once(prefect_api, tmp_path, shell):
    run_dir = tmp_path / "run"
    terminal = shell(run_dir)
    wait_for_version(run_dir, 1, terminal)
    learner = int((run_dir / "learner.pid").read_text())
    assert learner in [p.pid for p in processes_of(run_dir)]
    os.kill(terminal.tandem, signal.SIGKILL)
    assert terminal.exit_status(timeout=10) == 128 + signal.SIGKILL
    killed = time.monotonic()

    assert still_running(run_dir, within_s=10) == []
    print(f"no process of the run left {time.monotonic() - killed:.1f}s after SIGKILL")
    assert not run_dir_locked(run_dir)
    target = (len(metrics(run_dir)) // 4 + 2) * 4
    result = resume_to(run_dir, target)
    assert "Retry" not in result.stdout + result.stderr, result.stdout[-3000:] + result.stderr[-3000:]
    assert steps(run_dir) == list(range(1, target + 1))
    assert balanced(json.loads((run_dir / "accounting.json").read_text()))
    # The killed run's flow run, which could not say so, is marked Crashed by the next.
    assert flow_run_state(run_dir) == ["CRASHED", "COMPLETED"]


@pytest.mark.parametrize("moment", ["Prefect UI", "starting:", "learner.pid"])
def test_ctrl_c_during_start_up_exits_130_within_10s(prefect_api, tmp_path, shell, moment):
    """`Prefect UI`: the flow's modules importing; `starting:` (the live line): the flow and
    the Dask cluster starting; `learner.pid`: the learner process importing, building its
    session and compiling its first step."""
    run_dir = tmp_path / "run"
    terminal = shell(run_dir)
    if moment == "learner.pid":
        while not (run_dir / "learner.pid").exists():
            assert terminal.process.poll() is None, terminal.output[-3000:]
            time.sleep(0.02)
    else:
        wait_for_output(terminal, moment)
    pressed = time.monotonic()
    terminal.press(CTRL_C)
    code = terminal.exit_status(timeout=60)
    seconds, output = time.monotonic() - pressed, terminal.output

    assert code == 130, output[-3000:]
    print(f"exited {seconds:.1f}s after Ctrl-C")
    assert seconds < 10, f"exited {seconds:.1f}s after Ctrl-C: {output[-2000:]}"
    for noise in ("Traceback", "KeyboardInterrupt", "ERROR"):
        assert noise not in output, output[-3000:]
    assert still_running(run_dir, within_s=3) == []
    assert not (run_dir / "learner.pid").exists() and not run_dir_locked(run_dir)
