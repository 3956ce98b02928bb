"""Runs untrusted Python code in a sandboxed subprocess: `run(code, limits) -> Result`.

Each run gets a fresh temporary directory as its working directory and these limits,
each enforced by the kernel, not by the code's good will:

    CPU time     RLIMIT_CPU: SIGXCPU at `cpu_s` (killed_reason "cpu"), SIGKILL a second later
    memory       RLIMIT_AS: allocations beyond `memory_mb` fail (MemoryError, "memory")
    output       RLIMIT_FSIZE: no file, stdout and stderr included, grows past
                 `output_bytes` (writes fail with EFBIG, "output")
    wall time    the whole process group is killed after `wall_s` ("wall", timed_out)
    network      a new, empty network namespace: no interface but a down loopback
    filesystem   a private mount namespace in which every mount is read-only except the
                 working directory; as root the code also runs as `nobody`, so files
                 that are not world-readable cannot be read either

The isolation needs Linux namespaces: as root they are created directly; otherwise
inside a new user namespace (unprivileged user namespaces must be enabled). Where
neither works, `run` raises `SandboxUnavailable` rather than run code unisolated.

The limits are applied by a launcher (`launcher.py`, run as a script in the child) and
not in a `preexec_fn`: actors call environments from threads (and JAX runs its own),
and a `preexec_fn` after `fork` in a threaded process can deadlock. The launcher then
`exec`s a clean interpreter (`python -I -S`: no site-packages, no PYTHON* variables)
on the code. Only the standard library is importable there. As root, that interpreter
must be one `nobody` can run: Tandem's own if it is installed world-readable, else the
system's `python3` (a Python under /root, as pyenv puts it, is not).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile

from tasks.actors.sandbox.launcher import NOBODY, SCRIPT

_LAUNCHER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "launcher.py")


class SandboxUnavailable(RuntimeError):
    """This machine cannot isolate the code (no namespaces); nothing was run."""


@dataclasses.dataclass(frozen=True)
class Limits:
    cpu_s: int = 1
    wall_s: float = 2.0
    memory_mb: int = 128
    output_bytes: int = 4096

    def __post_init__(self):
        for name in ("cpu_s", "wall_s", "memory_mb", "output_bytes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")


@dataclasses.dataclass(frozen=True)
class Result:
    stdout: str
    stderr: str
    exit: int  # the exit status; -N when a signal N ended the process
    timed_out: bool  # killed at the wall-time limit
    killed_reason: str | None  # the limit that ended the run: cpu, memory, output or wall

    @property
    def ok(self) -> bool:
        return self.exit == 0 and self.killed_reason is None


def run(code: str, limits: Limits = Limits()) -> Result:
    """Runs `code` as a Python script in the sandbox and waits for it."""
    with _Run(code, limits) as launch:
        proc = subprocess.Popen(**launch.popen_args())
        try:
            proc.wait(timeout=limits.wall_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
        launch.kill_group(proc.pid)
        return launch.result(proc.wait(), timed_out)


async def run_async(code: str, limits: Limits = Limits()) -> Result:
    """`run` for event loops: waits for the code without holding a thread."""
    with _Run(code, limits) as launch:
        args = launch.popen_args()
        proc = await asyncio.create_subprocess_exec(*args.pop("args"), **args)
        try:
            await asyncio.wait_for(proc.wait(), limits.wall_s)
            timed_out = False
        except asyncio.TimeoutError:
            timed_out = True
        launch.kill_group(proc.pid)
        return launch.result(await proc.wait(), timed_out)


class _Run(contextlib.AbstractContextManager):
    """One run's files: `work/` (the code's cwd), stdout and stderr (parent-owned), and a
    pipe on which the launcher reports a failure to isolate; all removed on exit."""

    def __init__(self, code: str, limits: Limits):
        self.limits = limits
        self.root = tempfile.mkdtemp(prefix="tandem-sandbox-")
        self.work = os.path.join(self.root, "work")
        os.mkdir(self.work)
        with open(os.path.join(self.work, SCRIPT), "w") as f:
            f.write(code)
        if os.geteuid() == 0:  # the code runs as nobody and owns only its directory
            os.chmod(self.root, 0o711)
            for path in (self.work, os.path.join(self.work, SCRIPT)):
                os.chown(path, NOBODY, NOBODY)
        self.stdout = open(os.path.join(self.root, "stdout"), "w+b")
        self.stderr = open(os.path.join(self.root, "stderr"), "w+b")
        self.status_r, self.status_w = os.pipe()

    def popen_args(self) -> dict:
        limits = self.limits
        argv = [sys.executable, "-I", "-S", _LAUNCHER, _code_interpreter(),
                str(self.status_w), str(limits.cpu_s), str(limits.memory_mb), str(limits.output_bytes)]
        return dict(args=argv, cwd=self.work, stdin=subprocess.DEVNULL, stdout=self.stdout,
                    stderr=self.stderr, pass_fds=(self.status_w,), start_new_session=True,
                    env={"PATH": "/usr/bin:/bin", "HOME": self.work, "TMPDIR": self.work,
                         "LC_ALL": "C.UTF-8"})

    @staticmethod
    def kill_group(pid: int) -> None:
        # Also reaps what the code left running in the background.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)

    def result(self, exit: int, timed_out: bool) -> Result:
        os.close(self.status_w)
        self.status_w = -1
        failure = os.read(self.status_r, 4096).decode(errors="replace")
        if failure:
            raise SandboxUnavailable(failure)
        stdout, stderr = self._read(self.stdout), self._read(self.stderr)
        if timed_out:
            reason = "wall"
        elif exit == -signal.SIGXCPU or exit == -signal.SIGKILL:
            reason = "cpu"  # SIGKILL: the hard CPU limit, a second after an ignored SIGXCPU
        elif max(os.fstat(f.fileno()).st_size for f in (self.stdout, self.stderr)) >= self.limits.output_bytes:
            reason = "output"
        elif exit != 0 and "MemoryError" in stderr:
            reason = "memory"
        else:
            reason = None
        return Result(stdout, stderr, exit, timed_out, reason)

    def _read(self, f) -> str:
        f.seek(0)
        return f.read(self.limits.output_bytes).decode(errors="replace")

    def __exit__(self, *exc) -> None:
        self.stdout.close()
        self.stderr.close()
        for fd in (self.status_r, self.status_w):
            if fd >= 0:
                os.close(fd)
        shutil.rmtree(self.root, ignore_errors=True)


def _runnable_by_others(path: str) -> bool:
    path = os.path.realpath(path)
    parents = [os.path.dirname(path)]
    while parents[-1] != "/":
        parents.append(os.path.dirname(parents[-1]))
    return os.stat(path).st_mode & 0o005 == 0o005 and all(os.stat(d).st_mode & 0o001 for d in parents)


@functools.cache
def _code_interpreter() -> str:
    if os.geteuid() != 0 or _runnable_by_others(sys.executable):
        return sys.executable
    system = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")
    if system is None or not _runnable_by_others(system):
        raise SandboxUnavailable(f"{sys.executable} is not runnable by nobody and there is no system python3")
    return system
