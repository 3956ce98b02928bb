"""The caller's side of one run (`Launch`): its private directory, the launcher's command
line and pipes, its cgroup; moving the launcher into that cgroup, killing the run, waiting
until its init is gone, and reading what the jail reported into a `Result`."""

from __future__ import annotations

import contextlib
import functools
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading

from tasks.actors.sandbox.cgroup import Cgroup
from tasks.actors.sandbox.interpreter import code_interpreter
from tasks.actors.sandbox.jail.protocol import SCRIPT, WORK
from tasks.actors.sandbox.limits import Limits
from tasks.actors.sandbox.result import Result, SandboxUnavailable, killed_reason

# The launcher is imported, not run as a script: its bytecode is then cached (compiling it
# costs ~10 ms). `-I` leaves neither the script's nor the current directory on sys.path;
# the jail's directory goes first there, its modules by their top-level names (jail/).
_JAIL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jail")
_LAUNCHER = ["-I", "-S", "-c", f"import sys; sys.path.insert(0, {_JAIL!r}); import launcher; launcher.main()"]


class Launch(contextlib.AbstractContextManager):
    """One run's files: its private directory (main.py, stdout, stderr, and the jail's mount
    point), the status pipe from the launcher, and its cgroups; all removed on exit."""

    def __init__(self, code: str, limits: Limits):
        self.limits = limits
        self.python, self.binds = code_interpreter()
        if os.geteuid() != 0:
            _check_unprivileged()
        self.cgroup = Cgroup.create(limits) if os.geteuid() == 0 else None
        # 0700: nothing in it is the code's. On a tmpfs where there is one: removing a
        # directory from a disk (ext4 with discard) costs ~5 ms, from /dev/shm ~0.
        self.root = tempfile.mkdtemp(prefix="tandem-sandbox-", dir=_scratch())
        with open(os.path.join(self.root, SCRIPT), "w") as f:
            f.write(code)
        self.stdout = open(os.path.join(self.root, "stdout"), "w+b")
        self.stderr = open(os.path.join(self.root, "stderr"), "w+b")
        self.status_r, self.status_w = os.pipe()
        os.set_blocking(self.status_r, False)
        self.go_r, self.go_w = os.pipe() if self.cgroup else (-1, -1)
        self.go_lock = threading.Lock()  # join_cgroup may run in an executor thread
        self.join_error = None
        self.status = b""

    def popen_args(self) -> dict:
        limits = self.limits
        argv = [sys.executable, *_LAUNCHER, self.python, str(self.status_w), str(self.go_r),
                repr(float(limits.cpu_s)), str(limits.memory_mb), str(limits.output_bytes), str(limits.processes),
                str(os.getpid()), os.pathsep.join(self.binds), self.cgroup.cpu_file if self.cgroup else ""]
        return dict(args=argv, cwd=self.root, stdin=subprocess.DEVNULL, stdout=self.stdout,
                    stderr=self.stderr, pass_fds=tuple(fd for fd in (self.status_w, self.go_r) if fd >= 0),
                    start_new_session=True,
                    env={"PATH": "/usr/bin:/bin", "HOME": WORK, "TMPDIR": WORK, "LC_ALL": "C.UTF-8"})

    def started(self) -> None:
        for name in ("status_w", "go_r"):
            if getattr(self, name) >= 0:
                os.close(getattr(self, name))
                setattr(self, name, -1)

    def join_cgroup(self, pid: int) -> None:
        """Moves the launcher into the run's cgroups while it starts up (the move waits for
        an RCU grace period, ~10 ms here: on the launcher's path it was most of a run's
        start-up), then lets it go on; all it forks is born inside them."""
        if not self.cgroup:
            return
        try:
            self.cgroup.join(pid)
            go = b"1"
        except OSError as e:
            self.kill(pid)
            self.join_error = f"cannot move the launcher into the run's cgroup: {e}"
            go = b""
        with self.go_lock:
            if self.go_w >= 0:  # (not if the run was aborted meanwhile)
                with contextlib.suppress(OSError):
                    os.write(self.go_w, go)
                os.close(self.go_w)
                self.go_w = -1

    def kill(self, pid: int) -> None:
        """At the wall time: the launcher and the init (its death takes the namespace)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)

    def abort(self, pid: int) -> None:
        """Kills the run when its caller gives up on it, and waits (briefly) until it is gone."""
        self.kill(pid)
        self.wait_gone(-1)

    def _read_status(self) -> str:
        with contextlib.suppress(BlockingIOError):
            while chunk := os.read(self.status_r, 65536):
                self.status += chunk
        return self.status.decode(errors="replace")

    def init_pidfd(self, exit: int) -> int | None:
        """A pidfd of the init if it may still be alive. A launcher that exited by itself
        had reaped the init, which exits only once its namespace is empty; one that was
        killed (`exit` < 0: at the wall time, with the init) had not, and the init may
        still be killing the tree."""
        if exit >= 0:
            return None
        init = [int(line.split()[1]) for line in self._read_status().splitlines() if line.startswith("init ")]
        if not init:
            return None  # killed before it forked the init: nothing ran
        try:
            return os.pidfd_open(init[0])
        except OSError:
            return None  # already gone, and reaped

    @staticmethod
    def reap(pidfd: int) -> None:
        """Closes the pidfd, first reaping the init if this process is its reaper (the
        launcher died first; we may be PID 1 of a container, or a subreaper)."""
        with contextlib.suppress(OSError):
            os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOHANG)
        os.close(pidfd)

    def wait_gone(self, exit: int, timeout: float = 5) -> None:
        pidfd = self.init_pidfd(exit)
        if pidfd is not None:
            try:
                select.select([pidfd], [], [], timeout)  # readable once it has exited
            finally:
                self.reap(pidfd)

    def result(self, exit: int, timed_out: bool) -> Result:
        status = self._read_status().splitlines()
        errors = [line[6:] for line in status if line.startswith("error ")] + \
            ([self.join_error] if self.join_error else [])
        if errors:
            raise SandboxUnavailable(errors[0])
        ends = [line.split() for line in status if line.startswith("exit ")]
        events = self.cgroup.events() if self.cgroup else {}
        stdout, stderr = self._read(self.stdout), self._read(self.stderr)
        init_reason = None  # the init's: the tree's CPU time or memory
        if ends:  # the code's own status, as the init saw it
            exit = os.waitstatus_to_exitcode(int(ends[0][1]))
            init_reason = None if ends[0][2] == "-" else ends[0][2]
        elif not timed_out and not events.get("oom_kill"):  # (the OOM killer may pick the launcher)
            raise SandboxUnavailable(f"the sandbox's launcher failed (exit {exit}): {stderr[-1000:]}")
        output_full = max(os.fstat(f.fileno()).st_size for f in (self.stdout, self.stderr)) >= self.limits.output_bytes
        reason = killed_reason(exit, timed_out, init_reason, events, stderr, output_full, self.cgroup is not None)
        return Result(stdout, stderr, exit, timed_out, reason)

    def _read(self, f) -> str:
        f.seek(0)
        return f.read(self.limits.output_bytes).decode(errors="replace")

    def __exit__(self, *exc) -> None:
        self.stdout.close()
        self.stderr.close()
        with self.go_lock:
            for fd in (self.status_r, self.status_w, self.go_r, self.go_w):
                if fd >= 0:
                    os.close(fd)
            self.go_w = -1
        if self.cgroup:
            self.cgroup.remove()
        shutil.rmtree(self.root, ignore_errors=True)


@functools.cache
def _scratch() -> str | None:
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK | os.X_OK) else None


@functools.cache
def _check_unprivileged() -> None:
    release = tuple(int(part) for part in os.uname().release.split(".")[:2] if part.isdigit())
    if release < (5, 14):
        raise SandboxUnavailable(f"not root and Linux {os.uname().release} < 5.14: RLIMIT_NPROC would count "
                                 "all of the user's processes, not the run's, so there is no process limit")
