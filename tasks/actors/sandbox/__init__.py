"""Runs untrusted Python code in a sandboxed subprocess: `run(code, limits) -> Result`.

Each run is a jail of its own, built by the launcher (`launcher.py`) with Linux
namespaces the way bubblewrap builds one (see "Why not bwrap" below):

    processes    a new PID namespace whose PID 1 is the launcher's init. When the code's
                 first process exits, or the run is killed (wall time, or the caller
                 cancelled), the init exits and the kernel kills everything left in the
                 namespace, setsid() daemons included; `run` returns only once all of
                 it is gone. The code sees only its own processes, in a /proc of its own.
    filesystem   a new root: an empty read-only tmpfs holding /usr (and /bin, /lib...)
                 and the interpreter's binary and lib directory, read-only; /dev/null,
                 zero, full, random and urandom; a minimal /etc; /proc; and the working
                 directory /work, a tmpfs of its own (at most `memory_mb`) that goes with
                 the run. No other file of the host is there: not the user's, not other
                 runs', no socket in /tmp or /run. Mounts are nosuid; no_new_privs is set.
    network      a new network namespace (no interface but a down loopback; abstract
                 Unix sockets are per namespace too); new IPC and UTS namespaces.
    identity     as root, the code runs as a uid of its own (UID_BASE + the launcher's
                 pid, 0x70000000 and up) without groups; not as root, in a user namespace
                 as the user, without capabilities. Either way there is no process or
                 file beyond its own for it to name, let alone signal, trace or open.

and these limits, each enforced by the kernel or by the init, not by the code's good will:

    CPU time     `cpu_s` (fractions too) for the whole tree: RLIMIT_CPU per process, and
                 the init reads the tree's CPU time every 50 ms (POLL_S); at `cpu_s`
                 every process gets SIGXCPU, a second later SIGKILL (killed_reason "cpu")
    memory       RLIMIT_AS per process: allocations beyond `memory_mb` fail
                 (MemoryError, "memory"); the tree together: see "Cgroups" below
    processes    at most `processes` processes and threads at once (the first included):
                 a fork beyond fails with EAGAIN (BlockingIOError, "processes")
    output       RLIMIT_FSIZE: no file, stdout and stderr included, grows past
                 `output_bytes` (writes fail with EFBIG, "output")
    wall time    the jail is killed after `wall_s` ("wall", timed_out)

Cgroups. As root, where the cgroup v1 memory and pids controllers are mounted (under
this process's own cgroups; cpuacct too if mounted) or cgroup v2 has them (in
/sys/fs/cgroup/tandem-sandbox), each run gets a cgroup of its own: memory limit
`memory_mb` without swap, pids.max `processes`, both for the whole tree, the launcher and
the init included (~4 MB between them, 2 processes not counted against `processes`). The
caller moves the launcher into it while the launcher starts up (the move waits for an RCU
grace period, ~10 ms here), so all the run's processes are born in it. The kernel then
bounds the tree exactly; the OOM killer picks within it ("memory"); a refused fork is
counted ("processes"); and the init reads the tree's CPU time from it, which counts even
children whose parent ignores SIGCHLD. Without cgroups (not root, or no writable cgroup
hierarchy: `cgroups()` says which and why):
  - processes: still exact: RLIMIT_NPROC, counted per run (per own uid as root, per user
    namespace otherwise, which needs Linux >= 5.14);
  - memory: the init sums the tree's proportional memory (PSS) every 50 ms and kills it
    above `memory_mb`; between two looks the tree can hold up to `processes` x
    `memory_mb` (each process's RLIMIT_AS), plus the /work tmpfs (files are capped at
    `output_bytes` each, 4096 of them);
  - CPU time: the init sums what it reaped and what lives in the namespace's /proc;
    children whose parent ignores SIGCHLD escape that sum once they exit (each is still
    held to `cpu_s` by its RLIMIT_CPU, and the whole run to `wall_s`).

The isolation needs Linux namespaces: as root they are created directly; otherwise in a
new user namespace (unprivileged user namespaces must be enabled, and Linux >= 5.14).
Where that fails, `run` raises `SandboxUnavailable` (with the reason) rather than run
the code less isolated. Not covered: the kernel itself (no seccomp filter; the code may
create user namespaces of its own, in which the jail's mounts are locked).

The jail is built by a launcher started as its own interpreter, not in a `preexec_fn`:
actors call environments from threads (and JAX runs its own), and a `preexec_fn` after
`fork` in a threaded process can deadlock. The code runs in a clean interpreter (`python
-I -S`: no site-packages, no PYTHON* variables): Tandem's own, whose binary and lib
directory are mounted read-only into the jail; as root they must be readable by others,
else the system's `python3` is used. Only the standard library is importable there.

Cost, measured on a 2-core VM shared with other work (`run("print(6*7)")` interleaved
with the previous sandbox, medians): 46-74 ms per run, 10th percentile ~48 ms
(previously 67-75 ms, ~67 ms); ~34-36 ms of CPU (previously ~30-33 ms); 8 `run_async`
at a time: 21.5-26 ms per run (previously 20-23 ms). Two Python start-ups are most of
it; the namespaces, mounts and the init add ~4 ms of CPU. The caller waits on a pidfd
rather than polling, imports the launcher from its cached bytecode (compiling it cost
~10 ms) and keeps its run directories on /dev/shm (removing one from this disk: ~5 ms).

Why not bwrap (or nsjail): bubblewrap builds the same jail (it was the model for this
one) but is a system package, not on PyPI, so `pip install` cannot bring it; it is
missing on many machines; unprivileged it needs the same user namespaces; nsjail is
packaged even less. Neither would replace the init: the tree's CPU time, the cgroups and
the status protocol would stay here, and the launcher's Python start-up with them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import itertools
import math
import numbers
import os
import select
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time

from tasks.actors.sandbox.launcher import SCRIPT, UID_BASE, WORK

# The launcher is imported, not run as a script: its bytecode is then cached (compiling it
# costs ~10 ms). `-I` leaves neither the script's nor the current directory on sys.path.
_LAUNCHER = ["-I", "-S", "-c", f"import sys; sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r}); "
                               "import launcher; launcher.main()"]
MIN_MEMORY_MB = 32  # the interpreter alone maps about 12 MB


class SandboxUnavailable(RuntimeError):
    """This machine cannot isolate the code (no namespaces); nothing was run."""


@dataclasses.dataclass(frozen=True)
class Limits:
    cpu_s: float = 1  # CPU seconds of the whole process tree; fractions are enforced to ~50 ms
    wall_s: float = 2.0
    memory_mb: int = 128
    output_bytes: int = 4096
    processes: int = 16  # processes and threads at once, the first included

    def __post_init__(self):
        for name in ("cpu_s", "wall_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number of seconds, got {value!r}")
        for name in ("memory_mb", "output_bytes", "processes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise ValueError(f"{name} must be a whole number, got {value!r}")
        for name in ("cpu_s", "wall_s", "memory_mb", "output_bytes", "processes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.memory_mb < MIN_MEMORY_MB:
            raise ValueError(f"memory_mb must be at least {MIN_MEMORY_MB} (the interpreter alone needs ~12 MB), "
                             f"got {self.memory_mb}")


@dataclasses.dataclass(frozen=True)
class Result:
    stdout: str
    stderr: str
    exit: int  # the exit status; -N when a signal N ended the process
    timed_out: bool  # killed at the wall-time limit
    killed_reason: str | None  # the limit that ended the run: cpu, memory, processes, output or wall

    @property
    def ok(self) -> bool:
        return self.exit == 0 and self.killed_reason is None


def run(code: str, limits: Limits = Limits()) -> Result:
    """Runs `code` as a Python script in the sandbox and waits for it (and all it started)."""
    with _Run(code, limits) as launch:
        proc = subprocess.Popen(**launch.popen_args())
        try:
            deadline = time.monotonic() + limits.wall_s
            launch.started()
            launch.join_cgroup(proc.pid)
            timed_out = not _exits_within(proc, max(0.0, deadline - time.monotonic()))
            if timed_out:
                launch.kill(proc.pid)
            exit = proc.wait()
        except BaseException:  # KeyboardInterrupt, say: the run must not outlive us
            launch.abort(proc.pid)
            raise
        launch.wait_gone(exit)
        return launch.result(exit, timed_out)


async def run_async(code: str, limits: Limits = Limits()) -> Result:
    """`run` for event loops: waits for the code without holding a thread."""
    loop = asyncio.get_running_loop()
    with _Run(code, limits) as launch:
        args = launch.popen_args()
        proc = await asyncio.create_subprocess_exec(*args.pop("args"), **args)
        try:
            deadline = loop.time() + limits.wall_s
            launch.started()
            if launch.cgroup:  # a blocking write of ~10 ms (an RCU grace period), off the loop
                await loop.run_in_executor(None, launch.join_cgroup, proc.pid)
            try:
                await asyncio.wait_for(proc.wait(), max(0.0, deadline - loop.time()))
                timed_out = False
            except asyncio.TimeoutError:
                timed_out = True
                launch.kill(proc.pid)
            exit = await proc.wait()
        except BaseException:  # cancelled, say: the run must not outlive the step
            launch.abort(proc.pid)
            raise
        pidfd = launch.init_pidfd(exit)
        if pidfd is not None:  # the init (and so the namespace) may still be going away
            try:
                await _readable(pidfd, timeout=5)
            finally:
                launch.reap(pidfd)
        return launch.result(exit, timed_out)


def _exits_within(proc: subprocess.Popen, timeout: float) -> bool:
    """`proc.wait(timeout)`, but woken by the exit itself (a pidfd), not by polling: the
    subprocess module polls with sleeps of up to 50 ms, most of a short run's cost."""
    try:
        pidfd = os.pidfd_open(proc.pid)
    except OSError:  # Linux < 5.3
        try:
            proc.wait(timeout=timeout)
            return True
        except subprocess.TimeoutExpired:
            return False
    try:
        return bool(select.select([pidfd], [], [], timeout)[0])
    finally:
        os.close(pidfd)


class _Run(contextlib.AbstractContextManager):
    """One run's files: its private directory (main.py, stdout, stderr, and the jail's mount
    point), the status pipe from the launcher, and its cgroups; all removed on exit."""

    def __init__(self, code: str, limits: Limits):
        self.limits = limits
        self.python, self.binds = _code_interpreter()
        if os.geteuid() != 0:
            _check_unprivileged()
        self.cgroup = _Cgroup.create(limits) if os.geteuid() == 0 else None
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
        status = self._read_status()
        errors = [line[6:] for line in status.splitlines() if line.startswith("error ")] + \
            ([self.join_error] if self.join_error else [])
        if errors:
            raise SandboxUnavailable(errors[0])
        ends = [line.split() for line in status.splitlines() if line.startswith("exit ")]
        events = self.cgroup.events() if self.cgroup else {}
        stdout, stderr = self._read(self.stdout), self._read(self.stderr)
        init_reason = None  # the init's: the tree's CPU time or memory
        if ends:  # the code's own status, as the init saw it
            exit = os.waitstatus_to_exitcode(int(ends[0][1]))
            init_reason = None if ends[0][2] == "-" else ends[0][2]
        elif not timed_out and not events.get("oom_kill"):  # (the OOM killer may pick the launcher)
            raise SandboxUnavailable(f"the sandbox's launcher failed (exit {exit}): {stderr[-1000:]}")
        if timed_out:
            reason = "wall"
        elif init_reason is not None:
            reason = init_reason
        elif events.get("oom_kill"):
            reason = "memory"  # the cgroup's OOM killer killed one of the run's processes
        elif events.get("forks_refused") and exit != 0:
            reason = "processes"  # a fork was refused at pids.max, and the run failed
        elif exit == -signal.SIGXCPU or exit == -signal.SIGKILL:
            reason = "cpu"  # SIGKILL: the hard CPU limit, a second after an ignored SIGXCPU
        elif max(os.fstat(f.fileno()).st_size for f in (self.stdout, self.stderr)) >= self.limits.output_bytes:
            reason = "output"
        elif exit != 0 and "MemoryError" in stderr:
            reason = "memory"
        elif exit != 0 and self.cgroup is None and "BlockingIOError" in stderr:
            reason = "processes"  # RLIMIT_NPROC: no counter says so, the code's error does
        else:
            reason = None
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


async def _readable(fd: int, timeout: float) -> None:
    loop = asyncio.get_running_loop()
    ready = loop.create_future()
    loop.add_reader(fd, lambda: ready.done() or ready.set_result(None))
    try:
        await asyncio.wait_for(ready, timeout)
    except asyncio.TimeoutError:
        pass
    finally:
        loop.remove_reader(fd)


@functools.cache
def _scratch() -> str | None:
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK | os.X_OK) else None


@functools.cache
def _check_unprivileged() -> None:
    release = tuple(int(part) for part in os.uname().release.split(".")[:2] if part.isdigit())
    if release < (5, 14):
        raise SandboxUnavailable(f"not root and Linux {os.uname().release} < 5.14: RLIMIT_NPROC would count "
                                 "all of the user's processes, not the run's, so there is no process limit")


# Cgroups ---------------------------------------------------------------------------

_V2_BASE = "tandem-sandbox"
_runs = itertools.count()


@dataclasses.dataclass
class _Cgroup:
    """One run's cgroups: one directory (v2) or one per hierarchy (v1)."""

    dirs: list
    version: int
    cpu_file: str = ""  # the tree's CPU time: cpu.stat (v2) or cpuacct.usage (v1, if mounted)

    def join(self, pid: int) -> None:
        for d in self.dirs:
            _write(os.path.join(d, "cgroup.procs"), str(pid))

    @classmethod
    def create(cls, limits: Limits) -> _Cgroup | None:
        setup = _cgroup_setup()
        if setup.error:
            return None
        name = f"tandem-sandbox-{os.getpid()}-{next(_runs)}"
        # pids: the launcher and the init are in it too (the init's 2 MB are charged to it too).
        memory, processes = str(limits.memory_mb << 20), str(limits.processes + 2)
        if setup.version == 2:
            d = os.path.join(setup.parents["v2"], name)
            cgroup = cls([d], 2, os.path.join(d, "cpu.stat"))
            settings = [("memory.max", memory), ("memory.swap.max", "0"), ("pids.max", processes)]
        else:
            dirs = {c: os.path.join(parent, name) for c, parent in setup.parents.items()}
            cpu_file = os.path.join(dirs["cpuacct"], "cpuacct.usage") if "cpuacct" in dirs else ""
            cgroup = cls(sorted(set(dirs.values())), 1, cpu_file)
            settings = [("memory.limit_in_bytes", memory), ("memory.memsw.limit_in_bytes", memory),
                        ("pids.max", processes)]
        try:
            for d in cgroup.dirs:
                os.mkdir(d)
            for file, value in settings:
                path = next((os.path.join(d, file) for d in cgroup.dirs if os.path.exists(os.path.join(d, file))),
                            None)
                if path is None and file in ("memory.swap.max", "memory.memsw.limit_in_bytes"):
                    continue  # no swap accounting: nothing to limit
                _write(path, value)
        except OSError as e:
            cgroup.remove()
            raise SandboxUnavailable(f"cannot set up the run's cgroup: {e}") from e
        return cgroup

    def events(self) -> dict:
        """oom_kill: processes the OOM killer killed; forks_refused: at pids.max."""
        found = {}
        for d in self.dirs:
            for file, key, name in (("memory.events", "oom_kill", "oom_kill"),
                                    ("memory.oom_control", "oom_kill", "oom_kill"),
                                    ("pids.events", "max", "forks_refused")):
                with contextlib.suppress(OSError), open(os.path.join(d, file)) as f:
                    for line in f:
                        if line.split()[:1] == [key]:
                            found[name] = found.get(name, 0) + int(line.split()[1])
        return found

    def remove(self) -> None:
        for d in self.dirs:
            for delay in (0, 0.001, 0.01, 0.1):  # the last task may still be leaving
                time.sleep(delay)
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    continue


@dataclasses.dataclass(frozen=True)
class _CgroupSetup:
    version: int = 0
    parents: dict = dataclasses.field(default_factory=dict)
    error: str | None = None


def cgroups() -> str:
    """What bounds a run's whole process tree here: the cgroups used, or why none."""
    if os.geteuid() != 0:
        return "none: not root (the tree's memory is polled, its processes counted by RLIMIT_NPROC)"
    setup = _cgroup_setup()
    if setup.error:
        return f"none: {setup.error}"
    return f"cgroup v{setup.version}: " + ", ".join(f"{k} {v}" for k, v in sorted(setup.parents.items()))


_setup_lock = threading.Lock()


def _cgroup_setup() -> _CgroupSetup:
    with _setup_lock:  # once, even when the first runs start together
        return _find_cgroups()


@functools.cache
def _find_cgroups() -> _CgroupSetup:
    """Where this process can make runs' cgroups: v1 memory and pids hierarchies (under our
    own cgroups), else cgroup v2 with both controllers delegated to `tandem-sandbox`."""
    if os.geteuid() != 0:
        return _CgroupSetup(error="not root")
    try:
        with open("/proc/self/mountinfo") as f:
            mounts = [line.split() for line in f]
        with open("/proc/self/cgroup") as f:
            own = [line.rstrip("\n").split(":", 2)[1:] for line in f]  # [controllers, path] per hierarchy
    except OSError as e:
        return _CgroupSetup(error=f"cannot read /proc/self: {e}")
    v1, v2 = {}, None
    for fields in mounts:
        sep = fields.index("-")
        fstype, options, mount_root, point = fields[sep + 1], fields[sep + 3].split(","), fields[3], fields[4]
        if fstype == "cgroup2" and v2 is None:
            v2 = point
        if fstype != "cgroup":
            continue
        for controller in ("memory", "pids", "cpuacct"):  # cpuacct: if there, exact CPU time
            if controller in options:
                path = next((p for names, p in own if controller in names.split(",")), None)
                if path is not None and (path + "/").startswith(mount_root.rstrip("/") + "/"):
                    v1[controller] = os.path.join(point, path[len(mount_root.rstrip("/")):].lstrip("/"))
    if {"memory", "pids"} <= v1.keys():
        setup, error = _CgroupSetup(1, v1), _probe(sorted(set(v1.values())))
        return setup if error is None else _CgroupSetup(error=f"cgroup v1: {error}")
    if v2 is None:
        return _CgroupSetup(error="no cgroup v1 memory and pids hierarchies, no cgroup v2 mounted")
    try:
        with open(os.path.join(v2, "cgroup.controllers")) as f:
            available = f.read().split()
        if not {"memory", "pids"} <= set(available):
            return _CgroupSetup(error=f"cgroup v2 at {v2} lacks the memory or pids controller")
        base = os.path.join(v2, _V2_BASE)
        with open(os.path.join(v2, "cgroup.subtree_control")) as f:
            enabled = f.read().split()
        if not {"memory", "pids"} <= set(enabled):
            _write(os.path.join(v2, "cgroup.subtree_control"), "+memory +pids")
        os.makedirs(base, exist_ok=True)
        _write(os.path.join(base, "cgroup.subtree_control"), "+memory +pids")
    except OSError as e:
        return _CgroupSetup(error=f"cgroup v2 at {v2}: {e}")
    error = _probe([base])
    return _CgroupSetup(2, {"v2": base}) if error is None else _CgroupSetup(error=f"cgroup v2: {error}")


def _probe(parents: list) -> str | None:
    """Whether runs' cgroups can be made under `parents`; also removes stale ones (of
    processes that died without removing theirs)."""
    for parent in parents:
        for name in os.listdir(parent):
            if name.startswith("tandem-sandbox-") and name.count("-") == 3:
                pid = name.split("-")[2]
                if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
                    with contextlib.suppress(OSError):
                        os.rmdir(os.path.join(parent, name))
        probe = os.path.join(parent, f"tandem-sandbox-probe-{os.getpid()}")
        try:
            os.mkdir(probe)
            os.rmdir(probe)
        except OSError as e:
            return str(e)
    return None


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


# The interpreter -------------------------------------------------------------------

_SYSTEM_PREFIXES = ("/usr/", "/bin/", "/sbin/", "/lib/", "/lib32/", "/lib64/", "/libx32/")


@functools.cache
def _code_interpreter() -> tuple[str, tuple[str, ...]]:
    """The code's interpreter (a real path) and what of its installation to mount: the
    binary itself and its prefix's lib directories (the standard library, libpython, the
    libraries its extension modules link), not the whole prefix, which may be a home."""
    python = os.path.realpath(sys.executable)
    prefixes = {os.path.realpath(sys.base_prefix), os.path.realpath(sys.base_exec_prefix)}
    if os.geteuid() == 0 and os.stat(python).st_mode & 0o005 != 0o005:
        system = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")
        if system is None or os.stat(system).st_mode & 0o005 != 0o005:
            raise SandboxUnavailable(f"{python} is not runnable by others and there is no system python3")
        python = os.path.realpath(system)
        prefixes = {os.path.dirname(os.path.dirname(python))}
    binds = {python} | {os.path.join(p, lib) for p in prefixes for lib in ("lib", "lib64")}
    libdir = sysconfig.get_config_var("LIBDIR")  # a shared libpython, if it is elsewhere
    if libdir and python == os.path.realpath(sys.executable):
        binds.add(os.path.realpath(libdir))
    return python, tuple(sorted(b for b in binds if os.path.exists(b) and not (b + "/").startswith(_SYSTEM_PREFIXES)))
