"""Runs untrusted Python code in a sandboxed subprocess: `run(code, limits) -> Result`.

Each run is a jail of its own, built by the launcher (`jail/`) with Linux namespaces the
way bubblewrap builds one (see "Why not bwrap" below):

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

Modules: `running` (run, run_async) starts and waits for a `launch.Launch`, the caller's
side of one run (its directory, pipes and cgroup; it reads the jail's report into a
`result.Result`); `limits` (Limits); `cgroup` (where runs' cgroups can be made, and each
run's); `interpreter` (the code's Python, and what of it to mount); `jail/`, the child
side (the launcher, the init, the code's process and the new root): standard library only.
"""

from tasks.actors.sandbox.cgroup import cgroups
from tasks.actors.sandbox.jail.protocol import UID_BASE
from tasks.actors.sandbox.limits import MIN_MEMORY_MB, Limits
from tasks.actors.sandbox.result import Result, SandboxUnavailable
from tasks.actors.sandbox.running import run, run_async

__all__ = ["MIN_MEMORY_MB", "UID_BASE", "Limits", "Result", "SandboxUnavailable", "cgroups", "run", "run_async"]
