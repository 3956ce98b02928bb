"""Stopping a run from outside (`tasks.runtime.processes.interrupt`), with real signals and processes:
SIGTERM asks what a first Ctrl-C asks; processes started while SIGINT is blocked never see a
Ctrl-C, and none is lost meanwhile; a learner process takes SIGTERM as a stop and its task's
AT_ONCE as an exit, and ends with the process that started it."""

import contextlib
import multiprocessing
import os
import signal
import threading
import time

import psutil
import pytest

from tasks.runtime.processes.interrupt import Interrupt, blocking, deferred

SPAWN = multiprocessing.get_context("spawn")


def blocked_signals(pid: int) -> set[int]:
    mask = next(int(line.split()[1], 16) for line in open(f"/proc/{pid}/status") if line.startswith("SigBlk:"))
    return {n for n in range(1, 65) if mask >> (n - 1) & 1}


def threads_of(pid: int) -> list[str]:
    """What each thread of `pid` waits on (a failure's diagnosis)."""
    tasks = f"/proc/{pid}/task"
    return [f"{t}: {open(f'{tasks}/{t}/comm').read().strip()} {open(f'{tasks}/{t}/wchan').read()}"
            for t in os.listdir(tasks)] if os.path.isdir(tasks) else []


def test_sigterm_asks_what_a_first_ctrl_c_asks_however_often():
    interrupt = Interrupt()
    interrupt.request(signal.SIGTERM)
    interrupt.request(signal.SIGTERM)
    assert interrupt.is_set() and not interrupt.now and interrupt.signum == signal.SIGTERM
    interrupt.request(signal.SIGINT)  # a Ctrl-C after it: the second stop, at once
    assert interrupt.now and interrupt.signum == signal.SIGTERM  # the first decides the exit code

    interrupt.clear()
    interrupt.request(signal.SIGINT)
    interrupt.request(signal.SIGTERM)
    assert not interrupt.now and interrupt.signum == signal.SIGINT


def test_processes_started_while_sigint_is_blocked_never_see_it_and_none_is_lost():
    assert threading.current_thread() is threading.main_thread()
    caught = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    child = SPAWN.Process(target=time.sleep, args=(30,))
    try:
        with blocking(signal.SIGINT):
            child.start()
            os.kill(os.getpid(), signal.SIGINT)  # a Ctrl-C while the process starts
            os.kill(child.pid, signal.SIGINT)
        time.sleep(0.2)
        assert caught == [signal.SIGINT]  # once the block ended (or as another thread took it)
        assert signal.SIGINT in blocked_signals(child.pid) and child.is_alive()
    finally:
        signal.signal(signal.SIGINT, previous)
        child.kill()
        child.join()


class _Processes:
    """The learner's processes, as far as a stop touches them: counts the terminations."""

    terminated = 0

    def terminate(self):
        self.terminated += 1


def _pass_on(stepped: bool, interrupt: Interrupt):
    from tasks.runtime.processes.task import _pass_on

    processes, stop = _Processes(), threading.Event()
    return _pass_on(processes, stop, stepped=stepped, interrupt=interrupt), processes.terminated, stop.is_set()


def test_a_stop_before_the_learner_s_first_step_is_at_once():
    interrupt = Interrupt()
    assert _pass_on(stepped=True, interrupt=interrupt) == (None, 0, False)
    interrupt.request(signal.SIGTERM)
    assert _pass_on(stepped=True, interrupt=interrupt) == (None, 0, True)  # its next version
    terminated, count, asked = _pass_on(stepped=False, interrupt=interrupt)
    assert (terminated.why, count, asked) == ("before the learner's first step", 1, True)
    interrupt.request(signal.SIGINT)
    assert _pass_on(stepped=True, interrupt=interrupt)[0].why == "Ctrl-C twice"


def test_a_stop_is_passed_on_from_a_thread_of_its_own():
    """The relay's thread may be held in a call to the Prefect API for seconds; the stop
    reaches the learner meanwhile (this thread stands for the busy relay)."""
    from tasks.runtime.processes.task import _StopRelay

    interrupt, processes, stop = Interrupt(), _Processes(), threading.Event()
    with _StopRelay(processes, stop, interrupt) as stopping:
        stopping.stepped = True
        interrupt.request(signal.SIGINT)
        assert stop.wait(5)  # its next version
        time.sleep(0.1)
        assert (stopping.passed_on(), processes.terminated) == (None, 0)
        interrupt.request(signal.SIGINT)
        deadline = time.monotonic() + 5
        while stopping.passed_on() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert (stopping.passed_on().why, processes.terminated) == ("Ctrl-C twice", 1)


def test_a_stop_that_cannot_be_passed_on_fails_the_relay():
    from tasks.runtime.processes.task import _StopRelay

    class Processes:
        def terminate(self):
            raise ConnectionError("the learner cluster's scheduler is gone")

    interrupt = Interrupt()
    with _StopRelay(Processes(), threading.Event(), interrupt) as stopping:
        interrupt.request(signal.SIGINT)  # before the first step: at once
        deadline = time.monotonic() + 5
        with pytest.raises(ConnectionError, match="scheduler is gone"):
            while time.monotonic() < deadline:
                stopping.passed_on()
                time.sleep(0.01)


def _learner(queue, pid_file, ignores_at_once: bool) -> None:
    """A local learner process as `tasks.runtime.processes.task` sets one up, training forever."""
    from tasks.runtime.processes.hosts import AT_ONCE
    from tasks.runtime.processes.task import end_with_parent, take_signals

    sigterm = take_signals(AT_ONCE, leader=True)
    end_with_parent(AT_ONCE, pid_file)
    if ignores_at_once:  # one that does not unwind (in a long compile, say)
        signal.signal(AT_ONCE, signal.SIG_IGN)
    pid_file.write_text(str(os.getpid()))
    try:
        queue.put("started")
        while not sigterm():
            time.sleep(0.01)
        queue.put("stopping at its next version")
        while True:  # short waits, as the learner's: a signal another thread took runs at the next
            time.sleep(0.05)
    finally:
        pid_file.unlink(missing_ok=True)


def _task(queue, pid_file, ignores_at_once: bool) -> None:
    """The learner task's process: starts the learner, SIGINT and SIGTERM blocked meanwhile."""
    with blocking(signal.SIGINT, signal.SIGTERM):
        learner = SPAWN.Process(target=_learner, args=(queue, pid_file, ignores_at_once))
        learner.start()
    queue.put(learner.pid)
    learner.join()


def test_a_learner_process_takes_sigterm_as_a_stop_and_at_once_as_an_exit(tmp_path):
    from tasks.runtime.processes.hosts import AT_ONCE

    queue = SPAWN.Queue()
    learner = SPAWN.Process(target=_learner, args=(queue, tmp_path / "learner.pid", False))
    try:
        with blocking(signal.SIGINT, signal.SIGTERM):
            learner.start()
        assert queue.get(timeout=60) == "started"
        assert blocked_signals(learner.pid) & {signal.SIGINT, signal.SIGTERM} == {signal.SIGINT}
        os.kill(learner.pid, signal.SIGTERM)  # a Slurm job step's, say
        assert queue.get(timeout=10) == "stopping at its next version"
        os.kill(learner.pid, AT_ONCE)
        learner.join(30)  # the interpreter's teardown (Prefect's exit handlers) takes seconds
        assert learner.exitcode == 128 + AT_ONCE, threads_of(learner.pid) and not (tmp_path / "learner.pid").exists()
    finally:
        learner.kill()
        learner.join()


@pytest.mark.parametrize("ignores_at_once", [False, True])
def test_a_learner_process_ends_with_the_process_that_started_it(tmp_path, ignores_at_once):
    from tasks.runtime.processes.task import ORPHAN_S

    queue = SPAWN.Queue()
    task = SPAWN.Process(target=_task, args=(queue, tmp_path / "learner.pid", ignores_at_once))
    task.start()
    told = {type(message): message for message in (queue.get(timeout=60), queue.get(timeout=60))}
    learner = psutil.Process(told[int])
    try:
        assert told[str] == "started"
        os.kill(task.pid, signal.SIGKILL)
        killed = time.monotonic()
        while learner.is_running() and learner.status() != psutil.STATUS_ZOMBIE and time.monotonic() - killed < 10:
            time.sleep(0.05)
        assert time.monotonic() - killed < ORPHAN_S + 2, threads_of(learner.pid)
        assert not (tmp_path / "learner.pid").exists()
    finally:
        with contextlib.suppress(psutil.Error):
            learner.kill()
        task.join()


@pytest.fixture
def ctrl_c_raises():
    """Python's own SIGINT handler, as in a foreground process (pytest run in the background
    inherits an ignored SIGINT)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_a_deferred_ctrl_c_is_raised_as_the_block_ends_not_inside_it(ctrl_c_raises):
    finished = False
    with pytest.raises(KeyboardInterrupt):
        with deferred(signal.SIGINT):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)  # the handler has run by now: a raising one would have raised here
            finished = True
    assert finished
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_block_without_a_signal_runs_as_it_is(ctrl_c_raises):
    with deferred(signal.SIGINT):
        pass
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
