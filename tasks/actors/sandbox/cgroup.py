"""Cgroups: where this process can make them (found once), and each run's own (`Cgroup`),
which bounds the run's whole tree: its memory, its processes, and its CPU time as the
init reads it. `cgroups()` says what a run gets here, or why nothing."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import os
import threading
import time

from tasks.actors.sandbox.limits import Limits
from tasks.actors.sandbox.result import SandboxUnavailable

_V2_BASE = "tandem-sandbox"
_runs = itertools.count()


@dataclasses.dataclass
class Cgroup:
    """One run's cgroups: one directory (v2) or one per hierarchy (v1)."""

    dirs: list
    version: int
    cpu_file: str = ""  # the tree's CPU time: cpu.stat (v2) or cpuacct.usage (v1, if mounted)

    def join(self, pid: int) -> None:
        for d in self.dirs:
            _write(os.path.join(d, "cgroup.procs"), str(pid))

    @classmethod
    def create(cls, limits: Limits) -> Cgroup | None:
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
    v1, v2 = _mounted(mounts, own)
    if {"memory", "pids"} <= v1.keys():
        setup, error = _CgroupSetup(1, v1), _probe(sorted(set(v1.values())))
        return setup if error is None else _CgroupSetup(error=f"cgroup v1: {error}")
    if v2 is None:
        return _CgroupSetup(error="no cgroup v1 memory and pids hierarchies, no cgroup v2 mounted")
    return _delegate_v2(v2)


def _mounted(mounts: list, own: list) -> tuple[dict, str | None]:
    """Our own cgroup's directory in each v1 hierarchy of a controller we use (by
    controller), and where cgroup v2 is mounted, if it is."""
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
    return v1, v2


def _delegate_v2(v2: str) -> _CgroupSetup:
    """Enables the memory and pids controllers for runs' cgroups under `tandem-sandbox`
    at the root of cgroup v2 (mounted at `v2`)."""
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
