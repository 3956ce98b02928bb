import asyncio
import os
import signal
import socket
import tempfile
import time

import pytest

from tasks.actors import sandbox
from tasks.actors.sandbox import Limits


def test_runs_code_in_its_own_writable_directory():
    result = sandbox.run("import os\nopen('f', 'w').write('hi')\nprint(open('f').read(), sorted(os.listdir()))")
    assert result == sandbox.Result("hi ['f', 'main.py']\n", "", 0, False, None)
    assert result.ok


def test_writing_outside_its_directory_fails():
    with tempfile.TemporaryDirectory() as open_dir:
        os.chmod(open_dir, 0o777)  # so that only the read-only mounts can stop the write
        targets = [os.path.join(open_dir, "x"), "/tmp/tandem-escape", "/dev/shm/tandem-escape"]
        code = f"for path in {targets!r}:\n" \
               "    try:\n        open(path, 'w')\n    except OSError as e:\n        print(e.strerror)\n"
        result = sandbox.run(code)
        assert result.stdout.splitlines() == ["Read-only file system"] * 3
        assert not any(os.path.exists(path) for path in targets)


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root parent drops the code to nobody")
def test_code_runs_as_nobody_and_cannot_read_private_files(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("key")
    secret.chmod(0o600)
    result = sandbox.run(f"import os\nprint(os.getuid())\nopen({str(secret)!r}).read()")
    assert result.stdout == "65534\n" and "PermissionError" in result.stderr


def test_opening_a_socket_reaches_nothing():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        port = listener.getsockname()[1]
        result = sandbox.run(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)")
        assert "Network is unreachable" in result.stderr and result.exit == 1
        with pytest.raises(BlockingIOError):
            listener.accept()  # nobody connected


def test_exceeding_memory_fails_the_allocation():
    result = sandbox.run("x = bytearray(512 << 20)", Limits(memory_mb=128))
    assert result.killed_reason == "memory" and "MemoryError" in result.stderr
    assert sandbox.run("x = bytearray(32 << 20)", Limits(memory_mb=128)).ok


def test_exceeding_cpu_time_kills_before_the_wall_clock():
    started = time.monotonic()
    result = sandbox.run("while True: pass", Limits(cpu_s=1, wall_s=10))
    assert result.killed_reason == "cpu" and result.exit == -signal.SIGXCPU and not result.timed_out
    assert time.monotonic() - started < 5


def test_printing_without_end_stops_at_the_output_cap():
    result = sandbox.run("while True: print('x' * 100)", Limits(output_bytes=1000))
    assert result.killed_reason == "output" and len(result.stdout) == 1000
    assert "File too large" in result.stderr


def test_wall_timeout_kills_the_whole_process_group():
    code = "import subprocess, time\nprint(subprocess.Popen(['sleep', '30']).pid, flush=True)\ntime.sleep(30)"
    result = sandbox.run(code, Limits(wall_s=0.5))
    assert result.timed_out and result.killed_reason == "wall" and result.exit == -signal.SIGKILL
    assert _gone(int(result.stdout))


def test_run_async_enforces_the_same_limits():
    ok, slow = asyncio.run(_both("print(6 * 7)", "import time\ntime.sleep(30)"))
    assert ok.stdout == "42\n" and ok.ok
    assert slow.timed_out and slow.killed_reason == "wall"


def test_limits_must_be_positive():
    with pytest.raises(ValueError, match="memory_mb must be positive"):
        Limits(memory_mb=0)


async def _both(fast: str, slow: str):
    return await asyncio.gather(sandbox.run_async(fast), sandbox.run_async(slow, Limits(wall_s=0.3)))


def _gone(pid: int) -> bool:
    """Whether `pid` has exited (a zombie awaiting its reaper counts as gone)."""
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(")")[-1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False
