import asyncio
import inspect
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

import pytest

from tasks.actors import sandbox
from tasks.actors.sandbox import Limits, cgroup
from tests.support.waiting import wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
UNPRIVILEGED = 12345  # a uid no one uses, for the sandbox's non-root mode
# A program's own PID namespace, to find its processes from outside once the run is over.
PRINT_NS = "import os\nprint(os.readlink('/proc/self/ns/pid'), flush=True)\n"


@pytest.fixture(params=["cgroups", "no cgroups"])
def tree_limits(request, monkeypatch):
    """Runs a test with the run's cgroups (where this machine has them) and with the
    fallback used without them (RLIMIT_NPROC, the init's memory polling)."""
    if request.param == "cgroups":
        if cgroup._cgroup_setup().error:
            pytest.skip(f"no cgroups here: {sandbox.cgroups()}")
    else:
        monkeypatch.setattr(cgroup, "_cgroup_setup", lambda: cgroup._CgroupSetup(error="disabled by the test"))
    return request.param


def test_runs_code_in_its_own_writable_directory():
    result = sandbox.run("import os\nopen('f', 'w').write('hi')\nprint(open('f').read(), sorted(os.listdir()))")
    assert result == sandbox.Result("hi ['f', 'main.py']\n", "", 0, False, None)
    assert result.ok


def test_writing_outside_its_directory_fails():
    with tempfile.TemporaryDirectory() as open_dir:
        os.chmod(open_dir, 0o777)  # so that only the jail can stop the write
        hidden = os.path.join(open_dir, "x")  # not in the jail at all
        read_only = ["/tmp/tandem-escape", "/dev/shm/tandem-escape", "/usr/tandem-escape", "/tandem-escape"]
        code = f"for path in {[hidden] + read_only!r}:\n" \
               "    try:\n        open(path, 'w')\n    except OSError as e:\n        print(e.strerror)\n"
        result = sandbox.run(code)
        assert result.stdout.splitlines() == ["No such file or directory"] + ["Read-only file system"] * 4
        assert not any(os.path.exists(path) for path in [hidden] + read_only)


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root parent gives each run a uid of its own")
def test_each_run_has_a_uid_of_its_own_without_groups():
    code = "import os\nprint(os.getuid(), os.getgid(), os.getgroups())"
    first, second = (sandbox.run(code).stdout.split(" ", 2) for _ in range(2))
    assert int(first[0]) >= sandbox.UID_BASE and first[0] == first[1] and first[2] == "[]\n"
    assert first[0] != second[0]


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


def test_the_host_files_processes_and_sockets_are_out_of_reach(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("key")
    secret.chmod(0o600)
    with _unix_listeners() as listeners:
        result = sandbox.run(_probe_code(str(secret), listeners.path, listeners.abstract, [os.getpid(), os.getppid()]))
        _assert_out_of_reach(json.loads(result.stdout))
        for listener in listeners.sockets:
            with pytest.raises(BlockingIOError):
                listener.accept()  # nobody connected


def test_exceeding_memory_fails_the_allocation():
    result = sandbox.run("x = bytearray(512 << 20)", Limits(memory_mb=128))
    assert result.killed_reason == "memory" and "MemoryError" in result.stderr
    assert sandbox.run("x = bytearray(32 << 20)", Limits(memory_mb=128)).ok


def test_forked_children_share_one_memory_limit(tree_limits):
    code = """\
        import os, time
        children = []
        for _ in range(4):
            pid = os.fork()
            if pid == 0:
                x = bytearray(80 << 20)  # each child fits in the limit; two do not
                time.sleep(1)
                os._exit(0)
            children.append(pid)
        print(sum(os.waitpid(pid, 0)[1] == 0 for pid in children))
    """
    result = sandbox.run(textwrap.dedent(code), Limits(memory_mb=128, cpu_s=5, wall_s=10))
    assert result.killed_reason == "memory"
    # With cgroups the OOM killer kills children until the rest fit (one); without, the
    # init kills the tree when it sees it over the limit.
    assert result.stdout in ("", "0\n", "1\n")


def test_exceeding_cpu_time_kills_before_the_wall_clock():
    started = time.monotonic()
    result = sandbox.run("while True: pass", Limits(cpu_s=1, wall_s=10))
    assert result.killed_reason == "cpu" and result.exit == -signal.SIGXCPU and not result.timed_out
    assert time.monotonic() - started < 5


def test_the_cpu_limit_binds_the_whole_tree_and_takes_fractions():
    # Each process prints its CPU time as it spins: the last lines tell what they used.
    code = textwrap.dedent("""\
        import os, time
        for _ in range({forks}):
            os.fork()
        while True:
            for _ in range(100_000):
                pass
            print(os.getpid(), time.process_time(), flush=True)
    """)
    for forks, cpu_s, most in ((2, 1, 1.5), (0, 0.5, 0.75)):  # 4 processes at 1 s, 1 at 0.5 s
        result = sandbox.run(code.format(forks=forks), Limits(cpu_s=cpu_s, wall_s=20, output_bytes=1 << 20))
        assert result.killed_reason == "cpu" and result.exit == -signal.SIGXCPU and not result.timed_out
        used = dict(line.split() for line in result.stdout.splitlines())
        assert len(used) == 2 ** forks and cpu_s * 0.8 < sum(map(float, used.values())) < most


def test_children_whose_parent_ignores_sigchld_count_too(tree_limits):
    """Their times reach no parent's cutime: only the cgroup's accounting sees them."""
    if tree_limits != "cgroups":
        pytest.skip("without cgroups their CPU time is not counted once they exit (documented)")
    code = textwrap.dedent("""\
        import os, signal, time
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)
        while True:
            if os.fork() == 0:
                started = time.process_time()
                while time.process_time() - started < 0.3:
                    pass
                os._exit(0)
            time.sleep(0.35)
    """)
    result = sandbox.run(code, Limits(cpu_s=1, wall_s=10))
    assert result.killed_reason == "cpu" and not result.timed_out


def test_printing_without_end_stops_at_the_output_cap():
    result = sandbox.run("while True: print('x' * 100)", Limits(output_bytes=1000))
    assert result.killed_reason == "output" and len(result.stdout) == 1000
    assert "File too large" in result.stderr


def test_wall_timeout_kills_every_process_of_the_run():
    code = PRINT_NS + "import subprocess, time\nsubprocess.Popen(['sleep', '30'])\nos.setsid()\ntime.sleep(30)"
    result, returned = sandbox.run(code, Limits(wall_s=0.5)), _now()
    assert result.timed_out and result.killed_reason == "wall" and result.exit == -signal.SIGKILL
    assert _processes_in(result.stdout.split()[0], returned) == []


def test_no_process_outlives_its_run():
    code = PRINT_NS + textwrap.dedent("""\
        import time
        if os.fork() == 0:
            os.setsid()  # out of the process group, and a second fork: a daemon
            if os.fork() == 0:
                time.sleep(30)
            os._exit(0)
        os.wait()
    """)
    result, returned = sandbox.run(code, Limits(wall_s=10)), _now()
    assert result.ok
    assert _processes_in(result.stdout.split()[0], returned) == []


def test_a_fork_bomb_is_contained(tree_limits):
    # Every process forks two that do the same, to a depth of 7: 255 processes if nothing
    # refuses (bounded, so that a sandbox that fails this test does not take the machine
    # down with it); the limit is 16, the default. A process fails if a fork or a child of
    # it failed.
    code = PRINT_NS + textwrap.dedent("""\
        import sys, time, traceback
        def grow(depth):
            children = []
            for _ in range(2 if depth < 7 else 0):
                pid = os.fork()
                if pid == 0:
                    try:
                        status = grow(depth + 1)
                    except BaseException:
                        traceback.print_exc()
                        status = 1
                    os._exit(status)
                children.append(pid)
            time.sleep(0.2)
            return int(any(os.waitpid(pid, 0)[1] for pid in children))
        sys.exit(grow(0))
    """)
    started = time.monotonic()
    result, returned = sandbox.run(code, Limits(wall_s=10)), _now()
    assert Limits().processes == 16 and result.killed_reason == "processes" and result.exit == 1 and not result.timed_out
    assert "BlockingIOError" in result.stderr and time.monotonic() - started < 5
    assert _processes_in(result.stdout.split()[0], returned) == []


def test_the_process_limit_is_exact(tree_limits):
    code = textwrap.dedent("""\
        import os, time
        n = 1
        try:
            while n < 64:  # bounded: a sandbox without a process limit fails, and survives
                if os.fork() == 0:
                    time.sleep(5)
                    os._exit(0)
                n += 1
        except BlockingIOError:
            print(n)
    """)
    assert [sandbox.run(code, Limits(processes=n)).stdout for n in (1, 5)] == ["1\n", "5\n"]


def test_one_run_cannot_see_or_touch_another():
    # The first run writes its secret, takes a name the test can see, and waits (SIGUSR1
    # blocked, so that it ends the wait, not the run) until the test has run the second.
    marker = f"tfirst{os.getpid() % 10**6}"
    first_code = PRINT_NS + textwrap.dedent(f"""\
        import ctypes, signal
        signal.pthread_sigmask(signal.SIG_BLOCK, {{signal.SIGUSR1}})
        open('secret-of-the-first', 'w').write('mine')
        ctypes.CDLL(None).prctl(15, {marker.encode()!r})  # PR_SET_NAME
        released = signal.sigtimedwait({{signal.SIGUSR1}}, 50) is not None
        print(open('secret-of-the-first').read(), sorted(os.listdir()))
        print(released)
    """)
    first = []
    thread = threading.Thread(target=lambda: first.append((sandbox.run(first_code, Limits(wall_s=60)), _now())))
    thread.start()
    try:
        _wait_for_processes(marker, 1, "the first run, its secret written")
        second = _second_run()
    finally:
        for pid in _processes_named(marker):
            os.kill(pid, signal.SIGUSR1)
        thread.join()
    seen = json.loads(second.stdout)
    assert seen["pids"] == [1, seen["me"]]  # its init and itself: no other run's, no host's
    assert seen["cwds"] == {"1": "PermissionError", str(seen["me"]): ["main.py"]}
    assert seen["found"] == []
    # Its init: another uid as root; not as root, the same one, but PID 1 of a namespace
    # ignores any signal from inside it that it has no handler for.
    assert seen["kills"] == {str(os.getpid()): "ProcessLookupError", str(os.getppid()): "ProcessLookupError",
                             "1": "PermissionError" if os.geteuid() == 0 else "may"}
    # Released by the test: it ran all through the second run.
    (first, returned), = first
    assert first.stdout.splitlines()[1:] == ["mine ['main.py', 'secret-of-the-first']", "True"]
    assert _processes_in(first.stdout.split()[0], returned) == []


def test_non_root_mode_is_as_strict():
    """The sandbox run by an unprivileged user (a child of this test that drops to a
    uid of its own): its code cannot read the user's private file, signal the user's
    processes (even SIGKILL to all it may), reach the user's sockets, or exceed the
    process and memory limits."""
    if os.geteuid() != 0:
        pytest.skip("needs root to start the unprivileged user")
    home = tempfile.mkdtemp()
    try:
        os.chown(home, UNPRIVILEGED, UNPRIVILEGED)
        harness = "import json, os, signal, socket, sys, textwrap, time\n" + inspect.getsource(_probe_code) \
            + inspect.getsource(_unix_listeners) + inspect.getsource(_now) + textwrap.dedent(f"""\
            sys.path.insert(0, {ROOT!r})
            from tasks.actors import sandbox
            from tasks.actors.sandbox import Limits
            secret = os.path.join({home!r}, "secret")
            with open(secret, "w") as f:
                f.write("key")
            os.chmod(secret, 0o600)
            try:
                with _unix_listeners() as listeners:
                    probe = sandbox.run(_probe_code(secret, listeners.path, listeners.abstract,
                                                    [os.getpid(), os.getppid()], signal.SIGKILL, kill_all=True))
            except sandbox.SandboxUnavailable as e:
                print(json.dumps(dict(unavailable=str(e))))
                sys.exit()
            # The first process alone forks past the limit, so that the refused fork is its own
            # (its exit tells the limit): with 7 forks it could make all of them before any child
            # forked (8 processes, within the limit), exit 0, and leave the refusals to children.
            bomb = sandbox.run({PRINT_NS!r} + "for _ in range(16):\\n    os.fork()", Limits(processes=8))
            bomb_returned = _now()
            memory = sandbox.run("import os, time\\nfor _ in range(3):\\n    os.fork()\\n"
                                 "x = bytearray(40 << 20)\\ntime.sleep(2)", Limits(memory_mb=128, wall_s=10))
            print(json.dumps(dict(uid=os.getuid(), probe=json.loads(probe.stdout), bomb=bomb.killed_reason,
                                  bomb_ns=bomb.stdout.split()[0], bomb_returned=bomb_returned,
                                  memory=memory.killed_reason)))
        """)
        done = subprocess.run([_system_python(), "-c", harness], user=UNPRIVILEGED, group=UNPRIVILEGED,
                              extra_groups=[], cwd=home, capture_output=True, text=True, timeout=40)
        assert done.returncode == 0, done.stderr  # not killed by its sandboxed code
        report = json.loads(done.stdout)
        if "unavailable" in report:
            pytest.skip(f"no non-root sandbox here: {report['unavailable']}")
        assert report["uid"] == UNPRIVILEGED
        _assert_out_of_reach(report["probe"])
        assert report["bomb"] == "processes" and _processes_in(report["bomb_ns"], report["bomb_returned"]) == []
        assert report["memory"] == "memory"  # 8 x 40 MB: each fits, together they do not
    finally:
        subprocess.run(["rm", "-rf", home])


def test_run_async_enforces_the_same_limits():
    ok, slow = asyncio.run(_both("print(6 * 7)", "import time\ntime.sleep(30)"))
    assert ok.stdout == "42\n" and ok.ok
    assert slow.timed_out and slow.killed_reason == "wall"


def test_a_cancelled_run_is_killed():
    """An actor may cancel a step: its run, and what that started, ends with it."""
    marker = f"tandem{os.getpid() % 10**6}"  # the processes' name (comm), seen from outside
    code = textwrap.dedent(f"""\
        import ctypes, os, time
        ctypes.CDLL(None).prctl(15, {marker.encode()!r})  # PR_SET_NAME
        if os.fork() == 0:
            os.setsid()
            time.sleep(30)
        time.sleep(30)
    """)

    async def cancel_when_started():
        task = asyncio.ensure_future(sandbox.run_async(code, Limits(wall_s=30)))
        # Off the loop, which starts the run meanwhile.
        await asyncio.to_thread(_wait_for_processes, marker, 2, "the run and its child")
        assert len(_processes_named(marker)) == 2
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_when_started())
    assert _processes_named(marker) == []


def test_limits_must_be_positive():
    with pytest.raises(ValueError, match="memory_mb must be positive"):
        Limits(memory_mb=0)


@pytest.mark.parametrize("kwargs, message", [
    ({"cpu_s": "1"}, "cpu_s must be a finite number of seconds, got '1'"),
    ({"wall_s": float("inf")}, "wall_s must be a finite number"),
    ({"cpu_s": True}, "cpu_s must be a finite number"),
    ({"memory_mb": 1.5}, "memory_mb must be a whole number, got 1.5"),
    ({"output_bytes": "4096"}, "output_bytes must be a whole number"),
    ({"processes": 0}, "processes must be positive"),
    ({"memory_mb": 8}, "memory_mb must be at least 32"),
])
def test_limits_of_the_wrong_kind_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Limits(**kwargs)


async def _both(fast: str, slow: str):
    return await asyncio.gather(sandbox.run_async(fast), sandbox.run_async(slow, Limits(wall_s=0.3)))


def _second_run() -> sandbox.Result:
    """What a run sees of another (and of its host) while that one runs."""
    return sandbox.run(textwrap.dedent(f"""\
        import json, os
        pids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())
        cwds = {{}}
        for pid in pids:
            try:
                cwds[pid] = sorted(os.listdir(f'/proc/{{pid}}/cwd'))
            except OSError as e:
                cwds[pid] = type(e).__name__
        found = [d for top in ('/work', '/tmp', '/dev', '/etc', '/proc/1')
                 for d, _, files in os.walk(top) if 'secret-of-the-first' in files]
        kills = {{}}
        for pid in ({os.getpid()}, {os.getppid()}, 1):  # signal 0: may it, and is it there?
            try:
                os.kill(pid, 0)
                kills[pid] = 'may'
            except OSError as e:
                kills[pid] = type(e).__name__
        print(json.dumps(dict(me=os.getpid(), pids=pids, cwds=cwds, found=found, kills=kills)))
    """), Limits(wall_s=10))


def _probe_code(secret: str, socket_path: str, abstract: str, pids: list, sig: int = 0, kill_all: bool = False) -> str:
    """What sandboxed code tries against its host: a private file, Unix sockets (in /tmp
    and abstract), signal `sig` to the calling processes (0: may it, and are they there?);
    then, if `kill_all`, SIGKILL to all it may signal (only where a failure is harmless)."""
    return textwrap.dedent(f"""\
        import json, os, signal, socket
        tries = {{}}
        def attempt(name, f):
            try:
                f()
                tries[name] = "done"
            except OSError as e:
                tries[name] = type(e).__name__
        attempt("read", lambda: open({secret!r}).read())
        attempt("unix", lambda: socket.socket(socket.AF_UNIX).connect({socket_path!r}))
        attempt("abstract", lambda: socket.socket(socket.AF_UNIX).connect({abstract!r}))
        for pid in {pids!r}:
            attempt(f"kill {{pid}}", lambda: os.kill(pid, {sig}))
        if {kill_all!r}:
            attempt("kill -1", lambda: os.kill(-1, signal.SIGKILL))  # all it may signal, but itself
        print(json.dumps(tries))
    """)


def _assert_out_of_reach(tries: dict) -> None:
    kills = {name: outcome for name, outcome in tries.items() if name.startswith("kill ")}  # "kill -1" too:
    # ESRCH, none but itself (and the init, which kill(-1) spares)
    assert tries["read"] == "FileNotFoundError"  # not in the jail at all
    assert tries["unix"] == "FileNotFoundError"
    assert tries["abstract"] == "ConnectionRefusedError"  # another network namespace
    assert set(kills.values()) == {"ProcessLookupError"}, kills


class _unix_listeners:
    """A Unix socket in /tmp that anyone may connect to, and an abstract one."""

    def __enter__(self):
        self.path = os.path.join("/tmp", f"tandem-test-{os.getpid()}.sock")
        self.abstract = f"\0tandem-test-{os.getpid()}"
        self.sockets = []
        for address in (self.path, self.abstract):
            listener = socket.socket(socket.AF_UNIX)
            listener.bind(address)
            listener.listen()
            listener.setblocking(False)
            self.sockets.append(listener)
        os.chmod(self.path, 0o777)
        return self

    def __exit__(self, *exc):
        for listener in self.sockets:
            listener.close()
        os.unlink(self.path)


def _system_python() -> str:
    """An interpreter the unprivileged user can run (this one may live under /root)."""
    for python in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
        path = os.path.realpath(python)
        if os.path.exists(path) and all(os.stat(d).st_mode & 0o001 for d in _parents(path)) \
                and os.stat(path).st_mode & 0o001:
            return python
    pytest.skip("no Python interpreter the unprivileged user can run")


def _parents(path: str) -> list:
    parents = [os.path.dirname(path)]
    while parents[-1] != "/":
        parents.append(os.path.dirname(parents[-1]))
    return parents


def _wait_for_processes(comm: str, n: int, what: str) -> None:
    wait_until(lambda: len(_processes_named(comm)) >= n, what, timeout_s=30)


def _processes_named(comm: str) -> list:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                name, _, rest = f.read().partition("(")[2].rpartition(")")
            if name == comm and rest.split()[0] != "Z":
                found.append(int(pid))
        except OSError:
            continue
    return found


def _processes_in(pid_namespace: str, started_by: float) -> list:
    """The live processes (zombies are gone) in a PID namespace, e.g. 'pid:[4026532180]',
    that had started by `started_by` (CLOCK_BOOTTIME seconds, taken when the run returned).

    A gone namespace's number is free for the next one: under `pytest -n 2` another
    test's run may hold it by the time this looks, with processes started after ours ended.
    """
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{pid}/ns/pid") == pid_namespace:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rpartition(")")[2].split()  # from the state on: start time is the 20th
                if fields[0] != "Z" and int(fields[19]) / os.sysconf("SC_CLK_TCK") <= started_by:
                    found.append(int(pid))
        except OSError:
            continue
    return found


def _now() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)
