"""A run whose groups carry no learning signal ends by itself (README, "How a run ends"): the
livelock of a collapsed policy, reproduced from the first step by an environment no guess
wins (and one every guess wins: a solved game), through a real Prefect server and Dask cluster."""

import json
import time

import pytest

from tasks.buffer.ledger import balanced
from tests.conftest import ROOT, tandem
from tests.flows.test_interrupt_e2e import CTRL_C, TANDEM, Terminal

pytestmark = pytest.mark.e2e

FLAT = ["--set", "learner.batch_groups=4", "--set", "buffer.capacity=8", "--set", "learner.steps=50"]


@pytest.mark.parametrize("env, code, reason, says", [
    # A policy collapsed onto wrong play: short of its target (README, exit codes).
    ("AlwaysLoses", 3, "no-signal", "Stopped: no learning signal at step 0, version 0"),
    # A policy that solves every prompt starves the learner the same way, but reached its target.
    ("AlwaysWins", 0, "success", "Stopped early at the success target at step 0, version 0"),
])
def test_a_run_without_learning_signal_stops_on_a_checkpoint_with_its_reason(prefect_api, tmp_path,
                                                                           env, code, reason, says):
    run_dir = tmp_path / "run"
    result = tandem("run", "specs/guess-number.yaml", *FLAT, "--set", f"env.entrypoint=tests.support.flat_envs:{env}",
                    "--set", "learner.max_gen_batches=4", "--set", f"checkpoint.dir={run_dir}",
                    env={"XLA_FLAGS": "", "PYTHONPATH": str(ROOT)}, timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == code, output[-4000:]
    assert says in output, output[-4000:]
    assert "every group had the same reward in all its episodes" in output and "Traceback" not in output
    accounting = json.loads((run_dir / "accounting.json").read_text())
    assert accounting["stopped"]["reason"] == reason and balanced(accounting)
    assert accounting["consumed"] == 0 and accounting["excluded"]["filtered"] >= 16  # 4 batches of 4
    assert (run_dir / "checkpoints" / "0").is_dir()  # resumable: the ledger and cursor are saved
    assert not (run_dir / "learner.pid").exists()


def test_ctrl_c_while_the_learner_waits_for_signal_exits_within_ten_seconds(prefect_api, tmp_path):
    run_dir = tmp_path / "run"
    terminal = Terminal([TANDEM, "run", "specs/guess-number.yaml", *FLAT,
                         "--set", "env.entrypoint=tests.support.flat_envs:AlwaysLoses",
                         "--set", "learner.max_gen_batches=null", "--set", "learner.no_signal_s=null",
                         "--set", f"checkpoint.dir={run_dir}"],
                        env={"XLA_FLAGS": "", "COLUMNS": "160", "PYTHONPATH": str(ROOT)})
    # Pressed once the learner says it waits (not after a fixed sleep: on a slow machine that
    # lands in start-up, a case of its own in test_signals_e2e).
    deadline = time.monotonic() + 300
    while "has waited" not in terminal.output:
        assert terminal.process.poll() is None and time.monotonic() < deadline, terminal.output[-3000:]
        time.sleep(0.2)
    pressed = time.monotonic()
    terminal.press(CTRL_C)
    code = terminal.wait(timeout=60)
    assert code == 130, terminal.output[-3000:]
    assert time.monotonic() - pressed <= 10, f"exited {time.monotonic() - pressed:.1f}s after Ctrl-C"
    assert "Resume with:" in terminal.output and "Traceback" not in terminal.output
    assert json.loads((run_dir / "accounting.json").read_text())["stopped"]["reason"] == "interrupted"

