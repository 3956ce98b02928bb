"""Ctrl-C, as a user presses it: `tandem run` in a terminal of its own (a pty), the key
sent through the terminal, which signals every process of the foreground group (the CLI,
its Dask workers, the learner process)."""

import fcntl
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

import pytest

from tasks.buffer.ledger import balanced
from tests.conftest import ROOT, tandem

pytestmark = pytest.mark.e2e

TANDEM = str(Path(sys.executable).parent / "tandem")
TINY = ["--set", "learner.batch_groups=4", "--set", "buffer.capacity=8", "--set", "sync.interval=4",
        "--set", "checkpoint.every=1"]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
CTRL_C = b"\x03"  # the terminal's VINTR: SIGINT to its foreground process group


def _foreground() -> None:
    """In the child: a session of its own, whose controlling terminal is the pty, with
    Ctrl-C's default action, as an interactive shell starts a foreground job (a test run
    in the background, `make test &`, would otherwise pass on its ignored SIGINT)."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Terminal:
    """A command whose controlling terminal is a new pty; `output` is all it wrote."""

    def __init__(self, command: list[str], env: dict):
        master, slave = os.openpty()
        self.process = subprocess.Popen(
            command, cwd=ROOT, stdin=slave, stdout=slave, stderr=slave, env={**os.environ, **env},
            start_new_session=True, preexec_fn=_foreground)
        os.close(slave)
        self.master, self._output = master, bytearray()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:  # drained all along: a full pty would block the command
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:
                return
            if not data:
                return
            self._output.extend(data)

    def press(self, key: bytes) -> None:
        os.write(self.master, key)

    def wait(self, timeout: float) -> int:
        try:
            return self.process.wait(timeout)
        finally:
            self._reader.join(5)
            os.close(self.master)

    @property
    def output(self) -> str:
        return ANSI.sub("", self._output.decode(errors="replace")).replace("\r", "\n")


def metrics(run_dir) -> list[str]:
    return (run_dir / "metrics.jsonl").read_text().splitlines()


def start(run_dir, steps=400) -> Terminal:
    return Terminal([TANDEM, "run", "specs/guess-number.yaml", *TINY, "--set", f"learner.steps={steps}",
                     "--set", f"checkpoint.dir={run_dir}"],
                    env={"XLA_FLAGS": "", "COLUMNS": "160"})  # no virtual devices: compiles faster


def wait_for_version(run_dir, version: int, terminal: Terminal, timeout=300) -> None:
    deadline = time.monotonic() + timeout
    while not (run_dir / "checkpoints" / str(version)).exists():
        assert terminal.process.poll() is None, terminal.output[-3000:]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def left_behind(run_dir) -> list[str]:
    temporary = [p.name for p in (run_dir / "checkpoints").iterdir() if not p.name.isdigit()]
    return temporary + [name for name in ("learner.pid",) if (run_dir / name).exists()]


def test_ctrl_c_stops_on_a_checkpoint_and_the_printed_command_resumes_it(prefect_api, tmp_path):
    run_dir = tmp_path / "run"
    terminal = start(run_dir)
    wait_for_version(run_dir, 2, terminal)
    trained_before = len(metrics(run_dir))
    pressed = time.monotonic()
    terminal.press(CTRL_C)
    code = terminal.wait(timeout=60)
    seconds, output = time.monotonic() - pressed, terminal.output

    assert code == 130, output[-3000:]
    assert seconds < 10, f"exited {seconds:.1f}s after Ctrl-C"
    for noise in ("Traceback", "KeyboardInterrupt", "ERROR", "leaked"):
        assert noise not in output, output[-3000:]
    assert left_behind(run_dir) == []
    stopped = [json.loads(line)["step"] for line in metrics(run_dir)]
    version = max(int(p.name) for p in (run_dir / "checkpoints").iterdir())
    # On the first version boundary from where it was: every step it trained is checkpointed.
    assert stopped == list(range(1, version * 4 + 1)) and trained_before <= version * 4 < trained_before + 4 + 4
    assert f"its checkpoint of version {version} (step {version * 4})" in output
    (command,) = re.findall(r"Resume with: (.+)", output)

    before = metrics(run_dir)
    target = version * 4 + 8
    resumed = subprocess.run([*shlex.split(command.strip()), "--set", f"learner.steps={target}"], cwd=ROOT,
                             capture_output=True, text=True, env={**os.environ, "XLA_FLAGS": ""})
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    after = metrics(run_dir)
    assert after[:len(before)] == before  # nothing trained before the interrupt is lost or repeated
    assert [json.loads(line)["step"] for line in after] == list(range(1, target + 1))
    accounting = json.loads((run_dir / "accounting.json").read_text())
    assert balanced(accounting) and accounting["consumed"] == target * 4


@pytest.mark.slow  # 70 s on 2 cores: CI's time (README, "The two commands")
def test_a_second_ctrl_c_stops_at_once_and_leaves_nothing_behind(prefect_api, tmp_path):
    run_dir = tmp_path / "run"
    terminal = start(run_dir)
    wait_for_version(run_dir, 1, terminal)
    terminal.press(CTRL_C)
    time.sleep(0.05)
    terminal.press(CTRL_C)
    code = terminal.wait(timeout=60)
    output = terminal.output

    assert code == 130, output[-3000:]
    assert "Resume with:" in output and "Traceback" not in output, output[-3000:]
    assert left_behind(run_dir) == []
    result = tandem("resume", str(run_dir), "--set", f"learner.steps={(len(metrics(run_dir)) // 4 + 2) * 4}",
                    env={"XLA_FLAGS": ""})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
