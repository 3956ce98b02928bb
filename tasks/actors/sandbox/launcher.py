"""The sandbox's child side: builds the jail, then runs the code in it as its only tenant.

Run as `python -I -S -c "...import launcher; launcher.main()" ARGS...` (see `main` for
ARGS; imported rather than run as a script so that its bytecode is cached: compiling it
costs ~10 ms) in the run's private directory (it holds `main.py`, the code). Standard
library only, and little of it (no `ctypes`, `signal` or `select` wrappers: their imports
alone cost milliseconds), because it starts once per run. Three processes, all this file:

    launcher  new user (when not root), mount, network, PID, IPC and UTS namespaces;
              waits until the caller has moved it into the run's cgroups (GO_FD, when
              there are some), forks the init, reports its pid, waits for it, exits
    init      PID 1 of the new PID namespace: builds the new root (a tmpfs holding the
              read-only system directories, a fresh /proc, a few /dev nodes and the
              /work tmpfs), pivots into it, forks the code, reaps whatever is orphaned
              to it, and bounds the whole tree's CPU time (and, without cgroups, its
              memory) by polling the namespace's /proc. When the code exits, the init
              reports its status and exits, and the kernel kills everything left in the
              namespace before the launcher can see the init gone.
    code      drops to the run's own uid (as root), sets its rlimits and no_new_privs,
              and execs `python -I -S main.py` in /work.

Status lines go to STATUS_FD: `init PID` (the init's pid in the caller's namespace),
`exit WAITSTATUS REASON` (the code's end; REASON is `cpu`, `memory` or `-`) or
`error MESSAGE` (the jail could not be built; nothing ran). The code never holds the fd.
"""

import os
import sys

SCRIPT = "main.py"  # the code, written into the run's directory by the parent
WORK = "/work"  # the code's directory inside the jail: a tmpfs of its own
UID_BASE = 0x70000000  # as root, the code runs as UID_BASE + the launcher's pid: one uid per run
POLL_S = 0.05  # the init's interval for the tree's CPU time (and memory without cgroups)

_CLONE_NEWNS, _CLONE_NEWUTS, _CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
_CLONE_NEWUSER, _CLONE_NEWPID, _CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT = 1, 2, 4, 8, 32
_MS_BIND, _MS_REC, _MS_PRIVATE = 4096, 16384, 1 << 18
# Flags a read-only remount must repeat: in a user namespace the kernel refuses to clear them.
_KEPT_FLAGS = {"nosuid": 2, "nodev": 4, "noexec": 8, "noatime": 1024, "nodiratime": 2048,
               "relatime": 1 << 21, "strictatime": 1 << 24}
_MNT_DETACH = 2
_PR_SET_PDEATHSIG, _PR_SET_NO_NEW_PRIVS = 1, 38
_SIGKILL, _SIGCHLD, _SIGXCPU = 9, 17, 24
_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "ppc64": 203, "s390x": 217}
# What the jail shows of the host: these, read-only (or as the same symlinks).
_SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
_DEVICES = ("null", "zero", "full", "random", "urandom")


class _Failure(Exception):
    """The jail could not be built; reported on the status fd."""


class _Libc:
    """The few libc calls the stdlib lacks, through `_ctypes` (`ctypes` costs ~5 ms to import)."""

    def __init__(self):
        import _ctypes

        class Int(_ctypes._SimpleCData):
            _type_ = "i"

        class Func(_ctypes.CFuncPtr):
            _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
            _restype_ = Int

        class Lib:
            _handle = _ctypes.dlopen(None, 0)

        self._ctypes, self._func, self._lib = _ctypes, Func, Lib

    def __call__(self, name: str, *args, what: str = ""):
        ret = self._func((name, self._lib))(*args)
        if ret < 0:
            errno = self._ctypes.get_errno()
            raise _Failure(f"{what or name}: {os.strerror(errno)}")
        return ret


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _read(path: str) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 1 << 20).decode(errors="replace")
    finally:
        os.close(fd)


def _launch(cfg: dict) -> None:
    """The launcher: namespaces, then the init; exits when the init has exited."""
    status = cfg["status"]
    os.umask(0o022)  # the jail's directories must be searchable by the run's uid
    libc = _Libc()
    try:
        libc("prctl", _PR_SET_PDEATHSIG, _SIGKILL, 0, 0, 0)
        if os.getppid() != cfg["parent"]:
            raise _Failure("the caller exited before the sandbox started")
        flags = _CLONE_NEWNS | _CLONE_NEWNET | _CLONE_NEWPID | _CLONE_NEWIPC | _CLONE_NEWUTS
        if not cfg["root"]:  # keep our own ids inside the user namespace (not 0: exec drops its caps)
            uid, gid = os.getuid(), os.getgid()
            libc("unshare", flags | _CLONE_NEWUSER, what="unshare (user namespace)")
            for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
                _write(f"/proc/self/{name}", text)
        else:
            libc("unshare", flags)
    except (_Failure, OSError) as e:
        _fail(status, e)
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


def _fail(status: int, e: Exception) -> None:
    message = f"{e.strerror}: {e.filename}" if isinstance(e, OSError) and e.filename else str(e)
    os.write(status, f"error sandbox isolation failed: {message}\n".encode())
    os._exit(125)


def _init(cfg: dict, libc: _Libc, alive_r: int) -> None:
    status = cfg["status"]
    try:
        libc("prctl", _PR_SET_PDEATHSIG, _SIGKILL, 0, 0, 0)
        os.set_blocking(alive_r, False)
        try:
            os.read(alive_r, 1)
            os._exit(0)  # EOF: the launcher died before our death signal was armed
        except BlockingIOError:
            pass
        # The cgroup's CPU time, if there is one: the tree's, exactly, even of processes
        # whose parent ignores SIGCHLD (their times reach no one's cutime).
        cpu_fd = os.open(cfg["cpu_file"], os.O_RDONLY | os.O_CLOEXEC) if cfg["cpu_file"] else -1
        _build_root(cfg, libc)
    except (_Failure, OSError) as e:
        _fail(status, e)
    import _signal

    _signal.pthread_sigmask(_signal.SIG_BLOCK, [_SIGCHLD])  # waited for with sigtimedwait
    cpu = _TreeCpu(cpu_fd)
    code = os.fork()
    if code == 0:
        _exec_code(cfg, libc)
    wait_status, reason = _watch(cfg, code, _signal, cpu)
    os.write(status, f"exit {wait_status} {reason}\n".encode())
    os._exit(0)  # the kernel now kills what is left in the namespace


def _build_root(cfg: dict, libc: _Libc) -> None:
    """Mounts the jail's root on `root/` (under the run's directory) and pivots into it."""
    new = os.path.abspath("root").encode()
    libc("mount", b"none", b"/", None, _MS_REC | _MS_PRIVATE, None, what="private /")
    os.mkdir(new, 0o755)
    libc("mount", b"tandem-sandbox", new, b"tmpfs", _MS_NOSUID | _MS_NODEV, b"mode=0755,size=1m,nr_inodes=1024",
         what="tmpfs root")
    new = new.decode()
    for name in _SYSTEM_DIRS:
        source = "/" + name
        if os.path.islink(source):
            os.symlink(os.readlink(source), f"{new}/{name}")
        elif os.path.isdir(source):
            _bind(libc, source, f"{new}/{name}")
    for source in cfg["binds"]:  # the interpreter and its libraries, where they are not under /usr
        _bind(libc, source, new + source)
    for name in ("etc", "dev", "dev/shm", "tmp", "proc", "work"):
        os.makedirs(f"{new}/{name}", 0o755, exist_ok=True)
    uid, gid = cfg["uid"], cfg["gid"]
    _write(f"{new}/etc/passwd", f"root:x:0:0::/:/usr/sbin/nologin\nsandbox:x:{uid}:{gid}::{WORK}:/usr/sbin/nologin\n"
                                 "nobody:x:65534:65534::/nonexistent:/usr/sbin/nologin\n")
    _write(f"{new}/etc/group", f"root:x:0:\nsandbox:x:{gid}:\nnogroup:x:65534:\n")
    if os.path.exists("/etc/ld.so.cache"):  # libraries outside the loader's default directories
        with open("/etc/ld.so.cache", "rb") as src, open(f"{new}/etc/ld.so.cache", "wb") as dst:
            dst.write(src.read())
    if os.path.islink("/etc/localtime"):
        os.symlink(os.readlink("/etc/localtime"), f"{new}/etc/localtime")
    for name in _DEVICES:
        os.close(os.open(f"{new}/dev/{name}", os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o666))
        libc("mount", f"/dev/{name}".encode(), f"{new}/dev/{name}".encode(), None, _MS_BIND, None,
             what=f"bind /dev/{name}")
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"{new}/dev/{name}")
    libc("mount", b"proc", f"{new}/proc".encode(), b"proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None,
         what="mount /proc")
    work_size = f"mode=0700,uid={uid},gid={gid},size={cfg['memory_mb']}m,nr_inodes=4096".encode()
    libc("mount", b"tandem-work", f"{new}{WORK}".encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, work_size,
         what=f"tmpfs {WORK}")
    with open(SCRIPT, "rb") as src, open(f"{new}{WORK}/{SCRIPT}", "wb") as dst:
        dst.write(src.read())
    os.chown(f"{new}{WORK}/{SCRIPT}", uid, gid)
    writable = {f"{new}{WORK}", f"{new}/proc"} | {f"{new}/dev/{name}" for name in _DEVICES}
    for fields in (line.split() for line in _read("/proc/self/mountinfo").splitlines()):
        target = fields[4].encode().decode("unicode_escape")  # mountinfo escapes spaces as \040
        if (target == new or target.startswith(new + "/")) and target not in writable:
            flags = _MS_NOSUID | _MS_NODEV | sum(_KEPT_FLAGS.get(opt, 0) for opt in fields[5].split(","))
            libc("mount", None, target.encode(), None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | flags, None,
                 what=f"read-only {target}")
    os.chdir(new)
    pivot = _SYS_PIVOT_ROOT.get(os.uname().machine)
    if pivot is None:
        raise _Failure(f"pivot_root: unknown syscall number on {os.uname().machine}")
    libc("syscall", pivot, b".", b".", what="pivot_root")
    libc("umount2", b".", _MNT_DETACH, what="detach the old root")  # now no path leads outside
    os.chdir(WORK)
    libc("sethostname", b"sandbox", 7)


def _bind(libc: _Libc, source: str, target: str) -> None:
    if os.path.isdir(source):
        os.makedirs(target, 0o755, exist_ok=True)
    else:  # a file: the mount point is an empty file
        os.makedirs(os.path.dirname(target), 0o755, exist_ok=True)
        os.close(os.open(target, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o644))
    libc("mount", source.encode(), target.encode(), None, _MS_BIND | _MS_REC, None, what=f"bind {source}")


def _exec_code(cfg: dict, libc: _Libc) -> None:
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
        libc("prctl", _PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        os.set_inheritable(status, False)  # closed by the exec, kept to report its failure
        import _signal

        _signal.pthread_sigmask(_signal.SIG_UNBLOCK, [_SIGCHLD])
        os.execv(cfg["python"], [cfg["python"], "-I", "-S", SCRIPT])
    except (_Failure, OSError) as e:
        _fail(status, e)


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
                fields = _read(f"/proc/{pid}/stat").rpartition(")")[2].split()
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
        _signal.sigtimedwait([_SIGCHLD], POLL_S)
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
            _signal_all(_SIGKILL)
        elif used >= cpu_s and sent < 1:
            reason, sent = "cpu", 1
            _signal_all(_SIGXCPU)
        if poll_memory and len(pids) > 1 and reason != "memory" and _pss(pids) > memory:
            reason = "memory"  # (a single process is held by RLIMIT_AS)
            _signal_all(_SIGKILL)


def _pss(pids: list) -> int:
    """The processes' proportional memory: what they hold, shared pages split among them."""
    pss = 0
    for pid in pids:
        try:
            for line in _read(f"/proc/{pid}/smaps_rollup").splitlines():
                if line.startswith("Pss:"):
                    pss += int(line.split()[1]) << 10
                    break
        except OSError:
            continue
    return pss


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


if __name__ == "__main__":
    main()
