"""The jail's three processes (see the package docstring): the launcher, which makes the
namespaces; the init, PID 1 in them, which builds the root, forks the code and holds the
whole tree to its CPU time (and, without cgroups, its memory); and the code's process,
which takes on its limits and identity, then execs the code."""

import os
import sys

# All of the jail, loaded now: after the init's pivot_root its files are out of reach.
import rootfs
from protocol import SCRIPT, UID_BASE, Failure, fail
from syscalls import PR_SET_NO_NEW_PRIVS, PR_SET_PDEATHSIG, SIGCHLD, SIGKILL, SIGXCPU, Libc, read_file, write_file

POLL_S = 0.05  # the init's interval for the tree's CPU time (and memory without cgroups)
_CLONE_NEWNS, _CLONE_NEWUTS, _CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
_CLONE_NEWUSER, _CLONE_NEWPID, _CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000


def main(argv: list = None) -> None:
    """ARGS: PYTHON STATUS_FD GO_FD CPU_S MEMORY_MB OUTPUT_BYTES PROCESSES PARENT_PID BINDS
    CPU_FILE. GO_FD is -1 without cgroups; BINDS are paths joined by os.pathsep; BINDS and
    CPU_FILE (the run's cgroup's CPU time) may be empty."""
    (python, status, go, cpu_s, memory_mb, output_bytes, processes, parent, binds, cpu_file) = argv or sys.argv[1:]
    root = os.geteuid() == 0
    uid, gid = (UID_BASE + os.getpid(),) * 2 if root else (os.getuid(), os.getgid())
    _launch(dict(python=python, status=int(status), go=int(go), cpu_s=float(cpu_s), memory_mb=int(memory_mb),
                 output_bytes=int(output_bytes), processes=int(processes), parent=int(parent),
                 binds=[b for b in binds.split(os.pathsep) if b], cgroups=int(go) >= 0, cpu_file=cpu_file, root=root,
                 uid=uid, gid=gid))


def _launch(cfg: dict) -> None:
    """The launcher: namespaces, then the init; exits when the init has exited."""
    status = cfg["status"]
    os.umask(0o022)  # the jail's directories must be searchable by the run's uid
    libc = Libc()
    try:
        libc("prctl", PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0)
        if os.getppid() != cfg["parent"]:
            raise Failure("the caller exited before the sandbox started")
        flags = _CLONE_NEWNS | _CLONE_NEWNET | _CLONE_NEWPID | _CLONE_NEWIPC | _CLONE_NEWUTS
        if not cfg["root"]:  # keep our own ids inside the user namespace (not 0: exec drops its caps)
            uid, gid = os.getuid(), os.getgid()
            libc("unshare", flags | _CLONE_NEWUSER, what="unshare (user namespace)")
            for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
                write_file(f"/proc/self/{name}", text)
        else:
            libc("unshare", flags)
    except (Failure, OSError) as e:
        fail(status, e)
    if cfg["go"] >= 0 and os.read(cfg["go"], 1) != b"1":
        os._exit(125)  # the caller could not move us into the run's cgroups (and says why)
    alive_r, alive_w = os.pipe()  # the init learns of our death by EOF on alive_r
    pid = os.fork()
    if pid == 0:
        os.close(alive_w)
        _init(cfg, libc, alive_r)
    os.close(alive_r)
    os.write(status, f"init {pid}\n".encode())
    os.close(status)
    _, wait_status = os.waitpid(pid, 0)
    os._exit(os.waitstatus_to_exitcode(wait_status) & 0xFF)


def _init(cfg: dict, libc: Libc, alive_r: int) -> None:
    status = cfg["status"]
    try:
        libc("prctl", PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0)
        os.set_blocking(alive_r, False)
        try:
            os.read(alive_r, 1)
            os._exit(0)  # EOF: the launcher died before our death signal was armed
        except BlockingIOError:
            pass
        # The cgroup's CPU time, if there is one: the tree's, exactly, even of processes
        # whose parent ignores SIGCHLD (their times reach no one's cutime).
        cpu_fd = os.open(cfg["cpu_file"], os.O_RDONLY | os.O_CLOEXEC) if cfg["cpu_file"] else -1
        rootfs.build_root(cfg, libc)
    except (Failure, OSError) as e:
        fail(status, e)
    import _signal

    _signal.pthread_sigmask(_signal.SIG_BLOCK, [SIGCHLD])  # waited for with sigtimedwait
    cpu = _TreeCpu(cpu_fd)
    code = os.fork()
    if code == 0:
        _exec_code(cfg, libc)
    wait_status, reason = _watch(cfg, code, _signal, cpu)
    os.write(status, f"exit {wait_status} {reason}\n".encode())
    os._exit(0)  # the kernel now kills what is left in the namespace


def _exec_code(cfg: dict, libc: Libc) -> None:
    import resource

    status = cfg["status"]
    try:
        cpu = -int(-cfg["cpu_s"] // 1)  # whole seconds, rounded up: the init enforces fractions
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        resource.setrlimit(resource.RLIMIT_AS, (cfg["memory_mb"] << 20,) * 2)
        resource.setrlimit(resource.RLIMIT_FSIZE, (cfg["output_bytes"],) * 2)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        # Counted per uid (as root, the run's own) or per user namespace (where the launcher
        # and the init count too); with cgroups one more than pids.max, so that it is the
        # cgroup that refuses a fork, and says so in pids.events.
        extra = (1 if cfg["cgroups"] else 0) if cfg["root"] else 2
        resource.setrlimit(resource.RLIMIT_NPROC, (cfg["processes"] + extra,) * 2)
        if cfg["root"]:
            os.setgroups([])
            os.setgid(cfg["gid"])
            os.setuid(cfg["uid"])
        libc("prctl", PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        os.set_inheritable(status, False)  # closed by the exec, kept to report its failure
        import _signal

        _signal.pthread_sigmask(_signal.SIG_UNBLOCK, [SIGCHLD])
        os.execv(cfg["python"], [cfg["python"], "-I", "-S", SCRIPT])
    except (Failure, OSError) as e:
        fail(status, e)


class _TreeCpu:
    """CPU seconds the code's tree has used since it was forked: from the cgroup's
    accounting (less the init's own), else summed from the namespace's /proc."""

    def __init__(self, fd: int):
        self.fd, self.tick = fd, os.sysconf("SC_CLK_TCK")
        self.start = self._cgroup() - self._own() if fd >= 0 else 0.0

    def _cgroup(self) -> float:
        fields = os.pread(self.fd, 4096, 0).split()
        if fields[0] == b"usage_usec":  # v2 cpu.stat
            return int(fields[1]) / 1e6
        return int(fields[0]) / 1e9  # v1 cpuacct.usage, in ns

    @staticmethod
    def _own() -> float:
        times = os.times()
        return times.user + times.system

    def used(self, pids: list) -> float:
        if self.fd >= 0:
            return self._cgroup() - self._own() - self.start
        times = os.times()
        used = times.children_user + times.children_system  # what the init reaped, with what they reaped
        for pid in pids:
            try:
                fields = read_file(f"/proc/{pid}/stat").rpartition(")")[2].split()
            except OSError:
                continue  # gone meanwhile: its time is counted by whoever reaped it
            used += sum(int(f) for f in fields[11:15]) / self.tick  # utime stime cutime cstime
        return used


def _signal_all(sig: int) -> None:
    try:
        os.kill(-1, sig)  # from PID 1: every other process in the namespace
    except ProcessLookupError:
        pass


def _watch(cfg: dict, code: int, _signal, cpu: _TreeCpu) -> tuple:
    """Reaps until the code exits; meanwhile holds the tree to its CPU time (and memory)."""
    cpu_s, memory = cfg["cpu_s"], cfg["memory_mb"] << 20
    poll_memory = not cfg["cgroups"]  # with cgroups the kernel bounds the tree's memory exactly
    reason, sent = "-", 0
    while True:
        _signal.sigtimedwait([SIGCHLD], POLL_S)
        while True:
            try:
                pid, wait_status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                pid = 0
            if pid == 0:
                break
            if pid == code:
                return wait_status, reason
        pids = [name for name in os.listdir("/proc") if name.isdigit() and name != "1"]
        used = cpu.used(pids)
        if used >= cpu_s + 1 and sent < 2:  # RLIMIT_CPU's semantics, for the tree: SIGXCPU, then SIGKILL
            reason, sent = "cpu", 2
            _signal_all(SIGKILL)
        elif used >= cpu_s and sent < 1:
            reason, sent = "cpu", 1
            _signal_all(SIGXCPU)
        if poll_memory and len(pids) > 1 and reason != "memory" and _pss(pids) > memory:
            reason = "memory"  # (a single process is held by RLIMIT_AS)
            _signal_all(SIGKILL)


def _pss(pids: list) -> int:
    """The processes' proportional memory: what they hold, shared pages split among them."""
    pss = 0
    for pid in pids:
        try:
            for line in read_file(f"/proc/{pid}/smaps_rollup").splitlines():
                if line.startswith("Pss:"):
                    pss += int(line.split()[1]) << 10
                    break
        except OSError:
            continue
    return pss


if __name__ == "__main__":
    main()
