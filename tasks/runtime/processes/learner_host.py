"""One learner process on a Dask worker (`learner.cluster: tcp://...`): the Dask task that
runs it, and the process itself.

The Dask task does not run the learner: it starts it as a child process and waits on it,
returning its exit code. So the worker never calls `jax.distributed.initialize` (a retry
landing on the same worker would find it initialised), a child that dies, even by kill -9,
is an exit code for the task to report rather than a dead worker, and nothing depends on
whether the worker's process may have children of its own (a nanny's worker is daemonic:
`multiprocessing` refuses it, `subprocess` does not).

The task also carries what the local processes get from their parent (`tasks.runtime.processes.task`):
  - the leader's events: the child writes them to a pipe, as a local leader does
    (`tasks.runtime.processes.relay`); the task forwards each, as the bytes it read, to a Dask queue
    the learner task reads, and closes it with END, once the pipe's end of file says no
    more can come;
  - the learner task's signals, from a Dask variable the task polls: STOP (end at the next
    version: SIGUSR1 to the leader) and TERMINATE (SIGTERM, to unwind);
  - being given up on: once the learner task cancels this Dask task, or goes, the child is
    killed. The child in turn kills itself when this task's process goes (its stdin, a pipe
    from it, ends), so no learner outlives its host's worker.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import threading
from multiprocessing.connection import Connection
from typing import Callable

from distributed import Queue, Variable, get_worker

from tasks.runtime.processes.relay import EventWriter

RUN, STOP, TERMINATE = "run", "stop", "terminate"  # the learner task's signals, in the order they escalate
END = None  # the last item of the events queue: the leader's events ended
POLL_S = 0.5  # how often the Dask task checks its child, its signal and its own cancellation
SIGNALS_TIMEOUT_S = 30.0  # the learner task's signals unreadable for this long: the child is killed


def run_host(main: bytes, leader: bool, signals: str, events: str | None, cwd: str) -> int:
    """The Dask task of one learner host: runs `main` (pickled; called with the leader's
    event writer and stop flag when `leader`, else with nothing) in a child process, in
    `cwd` when this host has it; returns the child's exit code (negative: the signal).
    `signals` names the Dask variable of the learner task's signals; `events`, the leader's
    Dask queue of events."""
    read_end, write_end = os.pipe()
    child = subprocess.Popen([sys.executable, "-m", __name__, str(write_end)], stdin=subprocess.PIPE,
                             pass_fds=(write_end,), cwd=cwd if os.path.isdir(cwd) else None)
    os.close(write_end)
    pipe = Connection(read_end, writable=False)
    forwarder = threading.Thread(target=_forward, args=(pipe, Queue(events)), daemon=True) if leader else None
    try:
        child.stdin.write(main + pickle.dumps(leader))
        child.stdin.flush()  # and kept open: its end tells the child that this task has gone
        if forwarder is not None:
            forwarder.start()
        _watch(child, Variable(signals), leader)
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
        child.stdin.close()
    if forwarder is not None:
        forwarder.join()
    pipe.close()
    return child.returncode


def _forward(pipe: Connection, events: Queue) -> None:
    """Puts the leader's events, in order, into the events queue, then END once the pipe
    ends (the leader exited, or died: even in the middle of a message)."""
    try:
        while True:
            events.put(pipe.recv_bytes())
    except (EOFError, OSError):
        pass
    finally:
        events.put(END)
        events.close()


def _watch(child: subprocess.Popen, signals: Variable, leader: bool) -> None:
    """Waits for the child to exit, passing the learner task's signals on; kills it if this
    Dask task is cancelled (the learner task gave up, or went) or its signals cannot be read."""
    worker, key = get_worker(), get_worker().get_current_task()
    sent = RUN
    while True:
        try:
            child.wait(timeout=POLL_S)
            return
        except subprocess.TimeoutExpired:
            pass
        task = worker.state.tasks.get(key)
        if task is None or task.state == "cancelled":
            child.kill()
            return
        try:
            wanted = signals.get(timeout=SIGNALS_TIMEOUT_S)
        except TimeoutError:  # deleted, or the scheduler does not answer: no one can stop it
            child.kill()
            return
        if wanted != sent:
            if wanted == STOP and leader:
                child.send_signal(signal.SIGUSR1)
            elif wanted == TERMINATE:
                child.terminate()
            sent = wanted


def _child(events_fd: int) -> None:
    """The learner process: reads its main and role from stdin, then runs it."""
    main: Callable = pickle.load(sys.stdin.buffer)
    leader: bool = pickle.load(sys.stdin.buffer)
    threading.Thread(target=_die_with_parent, name="tandem-parent-watch", daemon=True).start()
    if not leader:
        os.close(events_fd)
        main()
        return
    stop = threading.Event()
    signal.signal(signal.SIGUSR1, lambda signum, frame: stop.set())
    main(EventWriter(Connection(events_fd, readable=False)), stop)


def _die_with_parent() -> None:
    """Ends this process once its stdin, a pipe from the Dask task, ends: that task's
    worker has gone, and no one is left to report this process or to stop it."""
    while os.read(sys.stdin.fileno(), 4096):  # not sys.stdin: its lock, held here, would abort the exit
        pass
    os._exit(1)


if __name__ == "__main__":
    _child(int(sys.argv[1]))
