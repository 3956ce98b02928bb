"""The learner task: owns the accelerator for the whole training, in a process of its own.

The task starts a learner process that runs a `Session` and relays its logs and version
records here, where the Prefect context is. If that process dies (an XLA abort, the OOM
killer, a kill -9, even in the middle of a message), the task stops the session's actors
and fails; Prefect retries it, and the new session resumes from the latest checkpoint.
So does any other failure of the task (relaying to Prefect, say): no exit leaves actors.
With `learner.hosts` N it starts N processes, on this machine (`tasks.runtime.processes.hosts`) or on
Dask workers with a `learner` resource (`tasks.runtime.processes.learner_cluster`), as `learner.cluster`
says: process 0 runs the session, the others follow it; one that dies fails the attempt, and
the retry restarts all.

Signals (`tasks.runtime.processes.interrupt`): a stop asked of the task (Ctrl-C or SIGTERM to `tandem
run`) ends the learner at its next version, or at once after a second Ctrl-C or before its
first step (nothing to checkpoint yet). A local learner process takes a SIGTERM of its own
(a Slurm job step signals every process) as the task's stop, and ends with the process that
started it (`tandem run` killed with SIGKILL), so no learner outlives its run and holds its
lock.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import multiprocessing
import os
import pickle
import signal
import sys
import threading
import time
import traceback
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

from distributed import Client
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from learner import multihost
from learner.multihost import PROCESS_ID_ENV
from tasks.buffer.channels import SCHEDULER_TIMEOUT_S, Channels, stop_actors
from tasks.records.artifacts import ProgressRecord
from tasks.records.loggers import PROGRESS_FEED, ROUTINE, Progress
from tasks.runtime.processes import learner_cluster
from tasks.runtime.session import lockstep
from tasks.runtime.session.build import RunSpec, build_follower, build_session
from tasks.runtime.session.failures import LearnerFailed, LearnerFailedUnrecoverably, Unrecoverable
from tasks.runtime.processes.hosts import AT_ONCE, LearnerProcesses, coordinator_environ
from tasks.runtime.processes.interrupt import INTERRUPT, Interrupt, blocking
from tasks.runtime.processes.relay import EventReader, LogForwarder
from tasks.runtime.session.stopping import StopReason
from tasks.runtime.processes.task_records import TaskRecords
from tasks.run_dir import RunDir

STOPPED_AT_ONCE = {"stopped": "at once"}  # the result of a learner terminated (`_pass_on`)
AT_ONCE_S = 5.0  # a learner told to stop at once and still running after this (in a compile, say) is killed
EARLY_S = 1.0  # the same, told before its first step: it has nothing to write, and the run's start-up waits
ORPHAN_S = 3.0  # a local learner whose parent has gone and still running after this is ended
PASS_ON_S = 0.02  # how often a stop asked of the task is looked for (`_StopRelay`)


def run_dir_locked(run_dir: Path) -> bool:
    """Whether a learner process holds the run directory's lock."""
    if not RunDir(run_dir).lock.exists():
        return False
    with RunDir(run_dir).lock.open("a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
    return False


def permanent(error: BaseException) -> bool:
    """Whether `error`, or an error it was raised from, is one no retry can fix."""
    while error is not None:
        if isinstance(error, (Unrecoverable, ImportError, SyntaxError)):
            return True
        error = error.__cause__ or error.__context__
    return False


def retriable(task, task_run, state) -> bool:
    """Prefect's retry condition: not after Ctrl-C, nor for an `Unrecoverable` failure."""
    return not (isinstance(state.result(raise_on_failure=False), Unrecoverable) or INTERRUPT.is_set())


@task(name="learner", retries=2, retry_delay_seconds=2, retry_condition_fn=retriable, cache_policy=NO_CACHE,
      persist_result=False)
def learn(spec: RunSpec, scheduler_address: str) -> dict:
    """Trains to `learner.steps`, resuming from the run directory's latest checkpoint."""
    log = get_run_logger()
    channels = Channels(uuid.uuid4().hex[:8])
    with _placed(spec, scheduler_address, channels) as (processes, events, stop):
        records = TaskRecords(spec, scheduler_address, log)
        # Ctrl-C and SIGTERM are for this process to pass on (`_relay`); a SIGTERM sent to
        # a learner process while it starts waits for its handler (`take_signals`).
        with blocking(signal.SIGINT, signal.SIGTERM):
            processes.start()
        events.started()
        result, grace_s = None, 30.0
        try:
            result = _relay(events, processes, log, spec, stop, records)
        except Exception:
            grace_s = 5.0  # failed, or given up on (a Prefect API error, say): a learner left running trains unrecorded
            raise
        finally:
            at_once = result is not None and result["stopped"] == STOPPED_AT_ONCE["stopped"]
            processes.stop(0.0 if at_once else grace_s)  # at once: given its seconds already (`_relay`)
            _clear_pid_files(spec, processes)
            events.close()
            records.close()
            if result is None or at_once:  # its session may not have stopped its actors
                _stop_actors(scheduler_address, channels, spec, log, asked=at_once)
        if result is None:
            raise RuntimeError(processes.death())
        return result


@contextlib.contextmanager
def _placed(spec: RunSpec, scheduler_address: str, channels: Channels) -> Iterator[tuple]:
    """The learner's processes, not started yet, where `learner.cluster` says; the reader of
    the leader's events; the flag that ends its training at the next version."""
    if spec.learner.cluster == "local":
        yield _local_processes(spec, scheduler_address, channels)
        return
    with learner_cluster.learner_client(spec.learner) as client:
        workers = learner_cluster.learner_workers(client, spec.learner.hosts)
        environs = learner_cluster.cluster_environ(client, workers)
        # Pickled here: the Dask task passes them on to the learner process it starts, unread.
        # Their Dask tasks stop them at once with SIGTERM (`tasks.runtime.processes.learner_host`).
        mains = [pickle.dumps(functools.partial(_learner_main, spec, scheduler_address, channels, environs[0],
                                                at_once=signal.SIGTERM))]
        mains += [pickle.dumps(functools.partial(_follower_main, spec, environ, at_once=signal.SIGTERM))
                  for environ in environs[1:]]
        processes = learner_cluster.ClusterProcesses(client, workers, mains, channels.session)
        yield processes, processes.events, processes.stop_flag


def _local_processes(spec: RunSpec, scheduler_address: str,
                     channels: Channels) -> tuple[LearnerProcesses, EventReader, Any]:
    """Processes on this machine (`tasks.runtime.processes.hosts`), the leader's events through a pipe."""
    context = multiprocessing.get_context("spawn")
    events, stop = EventReader(), context.Event()
    environs = coordinator_environ(spec.learner.hosts)
    leader = context.Process(target=_learner_main, name="tandem-learner",
                             args=(spec, scheduler_address, channels, environs[0], events.writer, stop))
    processes = LearnerProcesses([leader] + [context.Process(target=_follower_main, args=(spec, environ),
                                                             name=f"tandem-learner-{i}")
                                             for i, environ in enumerate(environs[1:], start=1)])
    return processes, events, stop


def _clear_pid_files(spec: RunSpec, processes) -> None:
    """Removes the pid files of local learner processes that were killed (one that exits
    removes its own): a pid file names a running learner."""
    if not isinstance(processes, LearnerProcesses):
        return
    run_dir = spec.run_dir.resolve()
    for i, process in enumerate((processes.leader, *processes.followers)):
        pid_file = RunDir(run_dir).pid(i)
        with contextlib.suppress(OSError):
            if process.exitcode is not None and pid_file.read_text() == str(process.pid):
                pid_file.unlink()


def _stop_actors(scheduler_address: str, channels: Channels, spec: RunSpec, log, asked: bool) -> None:
    """Stops the actors of a learner session that did not end cleanly (`asked`: stopped at
    once, as asked). Never raises: it runs while the task fails, and must not hide why."""
    (log.info if asked else log.warning)(f"stopping the actors of learner session {channels.session}")
    # A run that stops closes its local cluster next, which ends the actors: no buffer to drain for them.
    drain_s = 0.0 if INTERRUPT.is_set() and spec.actors.cluster == "local" else 5.0
    try:
        with Client(scheduler_address, timeout=SCHEDULER_TIMEOUT_S) as client:
            stop_actors(client, channels, spec.actors.workers, timeout_s=drain_s)
    except Exception as e:
        log.error(f"could not stop the actors of learner session {channels.session} ({type(e).__name__}: {e}); "
                  "they keep their worker threads until the Dask cluster restarts")


def _relay(events, processes: LearnerProcesses, log, spec: RunSpec, stop, records: TaskRecords) -> dict | None:
    """Forwards the process's events until it reports its result or dies, while `_StopRelay`
    passes a stop on; a learner stopped at once that is still running after its grace is
    given up on, and killed."""
    progress = None
    with _StopRelay(processes, stop) as stopping:
        while True:
            records.collect()
            terminated = stopping.passed_on()
            if terminated is not None and terminated.overdue():
                return terminated.result()
            if (event := events.get(timeout_s=0.2)) is None:
                if events.gone or processes.failed():  # gone: its end of the pipe closed, maybe mid-message
                    terminated = stopping.passed_on()  # told to stop at once meanwhile, it may have ended so
                    return terminated.result() if terminated else None
                continue
            kind, payload = event
            if kind == "log":
                level, message, routine = payload
                getattr(log, level)(message, extra=ROUTINE if routine else None)
            elif kind == "version":
                records.version(payload)
            elif kind == "eval":
                records.evaluate(payload)
            elif kind == "progress":
                if progress is None:
                    progress = ProgressRecord(run_name=spec.name, step=payload.step, version=payload.version,
                                              total_steps=spec.learner.steps)
                    stopping.stepped = True
                progress.update(payload.step, payload.version)
                PROGRESS_FEED.publish(payload)
            elif kind == "done":
                reason = StopReason(payload["stopped"])
                log.info(f"{reason.phrase} at step {payload['step']}, version {payload['version']}: {payload['message']}")
                if progress is not None:
                    progress.finish(payload["step"], payload["version"], reason.phrase.lower(),
                                    complete=reason != StopReason.INTERRUPTED)
                if reason != StopReason.INTERRUPTED:
                    records.collect(wait_s=records.last_wait_s)
                return payload
            elif kind == "error":
                if (terminated := stopping.passed_on()) is not None:  # its error is the stop's
                    return terminated.result()
                message, unrecoverable = payload
                raise (LearnerFailedUnrecoverably if unrecoverable else LearnerFailed)(message)


class _StopRelay:
    """Passes a stop asked of this process on (`_pass_on`) from a thread of its own, every
    `PASS_ON_S`: the relay's calls to the Prefect API (a version's record, a log line) can
    take a second on a loaded machine or against a remote server, and a learner that hears
    of a Ctrl-C a second late trains on to a later version than the one it was on."""

    def __init__(self, processes, stop, interrupt: Interrupt = INTERRUPT):
        self.stepped = False  # the learner has reported a step: a stop waits for its next version
        self._terminated: _Terminated | None = None
        self._failure: Exception | None = None
        self._processes, self._stop, self._interrupt = processes, stop, interrupt
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tandem-stop-relay", daemon=True)

    def __enter__(self) -> _StopRelay:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._closed.set()
        self._thread.join()

    def passed_on(self) -> _Terminated | None:
        """The learner's processes, if told to stop at once; raises what failed to tell them."""
        if self._failure is not None:
            raise self._failure
        return self._terminated

    def _run(self) -> None:
        try:
            while self._terminated is None and not self._closed.wait(PASS_ON_S):
                self._terminated = _pass_on(self._processes, self._stop, self.stepped, self._interrupt)
        except Exception as e:  # a learner cluster's scheduler gone, say: the relay fails the task with it
            self._failure = e


@dataclasses.dataclass(frozen=True)
class _Terminated:
    """The learner's processes, told to stop at once (`_pass_on`): when, and why."""

    at: float  # time.monotonic()
    why: str
    grace_s: float  # to unwind, before it is killed

    def overdue(self) -> bool:
        return time.monotonic() - self.at > self.grace_s

    def result(self) -> dict:
        return dict(STOPPED_AT_ONCE, message=self.why)


def _pass_on(processes, stop, stepped: bool, interrupt: Interrupt = INTERRUPT) -> _Terminated | None:
    """Passes a stop asked of this process on (`tasks.runtime.processes.interrupt`): `stop` ends
    training at the next version; a second Ctrl-C, or any stop before the learner's first
    step (not `stepped`: nothing to checkpoint yet, and its first compile may take long),
    terminates its processes, which unwind (stop their actors) and exit."""
    if interrupt.is_set():
        stop.set()
    if interrupt.now or (interrupt.is_set() and not stepped):
        processes.terminate()
        if interrupt.now:
            return _Terminated(time.monotonic(), "Ctrl-C twice", AT_ONCE_S)
        return _Terminated(time.monotonic(), "before the learner's first step", EARLY_S)
    return None


class _Events:
    """The learner process's logger and reporter: the task logs and records in Prefect."""

    def __init__(self, events):
        self._events = events

    def info(self, message: str) -> None:
        self._events.put(("log", ("info", message, False)))

    def routine(self, message: str) -> None:
        """An INFO record the terminal hides (`tasks.records.loggers.ROUTINE`)."""
        self._events.put(("log", ("info", message, True)))

    def warning(self, message: str) -> None:
        self._events.put(("log", ("warning", message, False)))

    def version(self, **fields) -> None:
        self._events.put(("version", fields))

    def progress(self, progress: Progress) -> None:
        self._events.put(("progress", progress))

    def evaluate(self, **fields) -> None:
        self._events.put(("eval", fields))


def _learner_main(spec: RunSpec, scheduler_address: str, channels: Channels, environ: dict[str, str],
                  events, stop, at_once: int = AT_ONCE) -> None:
    """Process 0 of the learner: runs the session; `environ` joins it to the other processes."""
    run_dir = spec.run_dir.resolve()
    pid_file = RunDir(run_dir).pid()
    sigterm = take_signals(at_once, leader=True)
    end_with_parent(at_once, pid_file)
    # One learner per run directory: a second one (a run started twice) would interleave
    # checkpoints and metrics. The kernel drops the lock when this process dies.
    lock = RunDir(run_dir).lock.open("w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        events.put(("error", (f"RuntimeError: {run_dir} is in use by another learner "
                              f"(pid {pid_file.read_text() if pid_file.exists() else '?'})", False)))
        return
    pid_file.write_text(str(os.getpid()))
    sys.unraisablehook = functools.partial(_unraisable_to, RunDir(run_dir).log)
    failed = False
    try:
        multihost.initialize(spec.learner.hosts, environ)
        with Client(scheduler_address) as client:
            relay = _Events(events)
            LogForwarder(events).install()  # warnings of parts without a log (`tasks.background`)
            session = build_session(spec, client, channels, log=relay, reporter=relay,
                                    interrupted=lambda: stop.is_set() or sigterm())
            result = session.run()
            if spec.learner.hosts > 1:
                lockstep.announce(lockstep.STOP)
            events.put(("done", result))
    except Exception as e:
        events.put(("error", (f"{type(e).__name__}: {e}", permanent(e))))
        # Its traceback to the run's log file, not the terminal: the task reports the failure once.
        with RunDir(run_dir).log.open("a") as f:
            f.write(f"learner process {os.getpid()} failed:\n{traceback.format_exc()}")
        failed = True
    except BaseException as e:  # stopped at once: SystemExit from `take_signals`
        events.put(("error", (f"{type(e).__name__}: {e}", permanent(e))))
        raise
    finally:
        pid_file.unlink(missing_ok=True)
        events.close()
        events.join_thread()
    if failed:
        sys.exit(1)


def _unraisable_to(log_file: Path, unraisable) -> None:
    """An error no one can catch (a library's callback on a closed event loop, as Orbax's
    after a failed restore), written to the run's log rather than over the terminal."""
    with contextlib.suppress(OSError), log_file.open("a") as f:
        f.write(f"{unraisable.err_msg or 'Exception ignored in'}: {unraisable.object!r}\n"
                + "".join(traceback.format_exception(unraisable.exc_type, unraisable.exc_value,
                                                     unraisable.exc_traceback)))


def _follower_main(spec: RunSpec, environ: dict[str, str], at_once: int = AT_ONCE) -> None:
    """Process i > 0 of a multi-host learner: takes the steps process 0 announces."""
    pid_file = RunDir(spec.run_dir.resolve()).pid(int(environ[PROCESS_ID_ENV]))
    take_signals(at_once, leader=False)
    end_with_parent(at_once, pid_file)
    pid_file.write_text(str(os.getpid()))
    try:
        multihost.initialize(spec.learner.hosts, environ)
        learner, checkpoints = build_follower(spec)
        lockstep.follow(learner, checkpoints, spec.learner.minibatches)
    finally:
        pid_file.unlink(missing_ok=True)


def take_signals(at_once: int, leader: bool) -> Callable[[], bool]:
    """How a learner process takes signals; returns whether a SIGTERM asked it to stop.

    `at_once`, its task's (`_pass_on`), unwinds it: the session stops its actors and closes
    its checkpoints, and the pid file goes. A SIGTERM from anyone else (a Slurm job step
    signals every process) asks the leader what a first Ctrl-C asks, its next version, and a
    follower nothing: it follows the leader. (On a learner cluster SIGTERM is the task's
    `at_once`: `tasks.runtime.processes.learner_host`.) SIGINT stays blocked (`tasks.runtime.processes.interrupt`).
    """
    signal.signal(at_once, lambda signum, _: sys.exit(128 + signum))
    asked = threading.Event()
    if at_once != signal.SIGTERM:
        signal.signal(signal.SIGTERM, (lambda *_: asked.set()) if leader else signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})  # one sent while it started: now
    return asked.is_set


def end_with_parent(at_once: int, pid_file: Path) -> None:
    """Ends this local learner process once the process that started it has gone (`tandem
    run` killed with SIGKILL): the local cluster of its actors went with it (distributed's
    processes watch their parent the same way), no task is left to report to, and its lock
    would fail the next `tandem resume`. It unwinds as if stopped at once, with no one left
    to read its output, and is ended if that takes over ORPHAN_S."""
    parent = multiprocessing.parent_process()
    if parent is None:  # started by `tasks.runtime.processes.learner_host`, which ends it with its worker
        return
    signal.signal(signal.SIGALRM, signal.SIG_DFL)  # its deadline, once orphaned: nothing else here times with it

    def watch() -> None:
        parent.join()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.dup2(devnull, sys.stderr.fileno())
        pid_file.unlink(missing_ok=True)
        # SIGALRM's default action: the kernel ends it, whatever holds Python's lock meanwhile.
        signal.setitimer(signal.ITIMER_REAL, ORPHAN_S)
        os.kill(os.getpid(), at_once)

    threading.Thread(target=watch, name="tandem-parent-watch", daemon=True).start()
