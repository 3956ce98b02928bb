"""The learner task: owns the accelerator for the whole training, in a process of its own.

The task starts a learner process that runs a `Session` and relays its logs and version
records here, where the Prefect context is. If that process dies (an XLA abort, the OOM
killer, a kill -9, even in the middle of a message), the task stops the session's actors
and fails; Prefect retries it, and the new session resumes from the latest checkpoint.
So does any other failure of the task (relaying to Prefect, say): no exit leaves actors.
With `learner.hosts` N it starts N processes, on this machine (`tasks.runtime.hosts`) or on
Dask workers with a `learner` resource (`tasks.runtime.learner_cluster`), as `learner.cluster`
says: process 0 runs the session, the others follow it; one that dies fails the attempt, and
the retry restarts all.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import multiprocessing
import os
import pickle
import signal
import sys
import uuid
from typing import Any, Iterator

from distributed import Client
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from learner import multihost
from learner.multihost import PROCESS_ID_ENV
from tasks.buffer.channels import SCHEDULER_TIMEOUT_S, Channels, stop_actors
from tasks.records.artifacts import ProgressRecord
from tasks.records.loggers import PROGRESS_FEED, Progress
from tasks.runtime import learner_cluster, lockstep
from tasks.runtime.build import RunSpec, build_follower, build_session
from tasks.runtime.failures import Unrecoverable
from tasks.runtime.hosts import LearnerProcesses, coordinator_environ
from tasks.runtime.interrupt import INTERRUPT, ignoring_sigint
from tasks.runtime.relay import EventReader, LogForwarder
from tasks.runtime.stopping import StopReason
from tasks.runtime.task_records import TaskRecords

PID_FILE = "learner.pid"  # in the run directory, while a learner process runs
LOCK_FILE = "learner.lock"  # held (flock) by that process
STOPPED_AT_ONCE = {"stopped": "at once"}  # the result of a learner terminated by a second Ctrl-C


def permanent(error: BaseException) -> bool:
    """Whether `error`, or an error it was raised from, is one no retry can fix."""
    while error is not None:
        if isinstance(error, (Unrecoverable, ImportError, SyntaxError)):
            return True
        error = error.__cause__ or error.__context__
    return False


def _retriable(task, task_run, state) -> bool:
    """Prefect's retry condition: not after Ctrl-C, nor for an `Unrecoverable` failure."""
    return not (isinstance(state.result(raise_on_failure=False), Unrecoverable) or INTERRUPT.is_set())


@task(name="learner", retries=2, retry_delay_seconds=2, retry_condition_fn=_retriable, cache_policy=NO_CACHE,
      persist_result=False)
def learn(spec: RunSpec, scheduler_address: str) -> dict:
    """Trains to `learner.steps`, resuming from the run directory's latest checkpoint."""
    log = get_run_logger()
    channels = Channels(uuid.uuid4().hex[:8])
    with _placed(spec, scheduler_address, channels) as (processes, events, stop):
        records = TaskRecords(spec, scheduler_address, log)
        with ignoring_sigint():  # Ctrl-C is for this process to pass on (`_relay`)
            processes.start()
        events.started()
        result, grace_s = None, 30.0
        try:
            result = _relay(events, processes, log, spec, stop, records)
        except Exception:
            grace_s = 5.0  # failed, or given up on (a Prefect API error, say): a learner left running trains unrecorded
            raise
        finally:
            processes.stop(grace_s)
            events.close()
            records.close()
            if result is None or result == STOPPED_AT_ONCE:  # its session may not have stopped its actors
                _stop_actors(scheduler_address, channels, spec.actors.n_actors, log)
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
        mains = [pickle.dumps(functools.partial(_learner_main, spec, scheduler_address, channels, environs[0]))]
        mains += [pickle.dumps(functools.partial(_follower_main, spec, environ)) for environ in environs[1:]]
        processes = learner_cluster.ClusterProcesses(client, workers, mains, channels.session)
        yield processes, processes.events, processes.stop_flag


def _local_processes(spec: RunSpec, scheduler_address: str,
                     channels: Channels) -> tuple[LearnerProcesses, EventReader, Any]:
    """Processes on this machine (`tasks.runtime.hosts`), the leader's events through a pipe."""
    context = multiprocessing.get_context("spawn")
    events, stop = EventReader(), context.Event()
    environs = coordinator_environ(spec.learner.hosts)
    leader = context.Process(target=_learner_main, name="tandem-learner",
                             args=(spec, scheduler_address, channels, environs[0], events.writer, stop))
    processes = LearnerProcesses([leader] + [context.Process(target=_follower_main, args=(spec, environ),
                                                             name=f"tandem-learner-{i}")
                                             for i, environ in enumerate(environs[1:], start=1)])
    return processes, events, stop


def _stop_actors(scheduler_address: str, channels: Channels, n_actors: int, log) -> None:
    """Stops the actors of a learner session that did not end cleanly. Never raises: it
    runs while the task fails, and must not hide why."""
    log.warning(f"stopping the actors of learner session {channels.session}")
    try:
        with Client(scheduler_address, timeout=SCHEDULER_TIMEOUT_S) as client:
            stop_actors(client, channels, n_actors)
    except Exception as e:
        log.error(f"could not stop the actors of learner session {channels.session} ({type(e).__name__}: {e}); "
                  "they keep their worker threads until the Dask cluster restarts")


def _relay(events, processes: LearnerProcesses, log, spec: RunSpec, stop, records: TaskRecords) -> dict | None:
    """Forwards the process's events until it reports its result or dies; passes a Ctrl-C
    on (`tasks.runtime.interrupt`): `stop` ends training at the next version, a second
    Ctrl-C terminates the process, which unwinds (stops its actors) and exits."""
    progress, terminated = None, False
    while True:
        records.collect()
        if INTERRUPT.is_set():
            stop.set()
        if INTERRUPT.now and not terminated:
            terminated = True
            processes.terminate()
        if (event := events.get(timeout_s=0.2)) is None:
            if events.gone or processes.failed():  # gone: its end of the pipe closed, maybe mid-message
                return dict(STOPPED_AT_ONCE) if terminated else None
            continue
        kind, payload = event
        if kind == "log":
            getattr(log, payload[0])(payload[1])
        elif kind == "version":
            records.version(payload)
        elif kind == "eval":
            records.evaluate(payload)
        elif kind == "progress":
            if progress is None:
                progress = ProgressRecord(run_name=spec.name, step=payload.step, version=payload.version,
                                          total_steps=spec.learner.steps)
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
            if terminated:
                return dict(STOPPED_AT_ONCE)
            message, unrecoverable = payload
            raise (Unrecoverable if unrecoverable else RuntimeError)(f"learner failed: {message}")


class _Events:
    """The learner process's logger and reporter: the task logs and records in Prefect."""

    def __init__(self, events):
        self._events = events

    def info(self, message: str) -> None:
        self._events.put(("log", ("info", message)))

    def warning(self, message: str) -> None:
        self._events.put(("log", ("warning", message)))

    def version(self, **fields) -> None:
        self._events.put(("version", fields))

    def progress(self, progress: Progress) -> None:
        self._events.put(("progress", progress))

    def evaluate(self, **fields) -> None:
        self._events.put(("eval", fields))


def _learner_main(spec: RunSpec, scheduler_address: str, channels: Channels, environ: dict[str, str],
                  events, stop) -> None:
    """Process 0 of the learner: runs the session; `environ` joins it to the other processes."""
    # Terminated (a second Ctrl-C): unwind, so the session stops its actors and closes its
    # checkpoints, and the pid file goes.
    signal.signal(signal.SIGTERM, lambda signum, _: sys.exit(128 + signum))
    run_dir = spec.run_dir.resolve()
    pid_file = run_dir / PID_FILE
    # One learner per run directory: a second one (a run started twice) would interleave
    # checkpoints and metrics. The kernel drops the lock when this process dies.
    lock = (run_dir / LOCK_FILE).open("w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        events.put(("error", (f"RuntimeError: {run_dir} is in use by another learner "
                              f"(pid {pid_file.read_text() if pid_file.exists() else '?'})", False)))
        return
    pid_file.write_text(str(os.getpid()))
    try:
        multihost.initialize(spec.learner.hosts, environ)
        with Client(scheduler_address) as client:
            relay = _Events(events)
            LogForwarder(events).install()  # warnings of parts without a log (`tasks.background`)
            session = build_session(spec, client, channels, log=relay, reporter=relay, interrupted=stop.is_set)
            result = session.run()
            if spec.learner.hosts > 1:
                lockstep.announce(lockstep.STOP)
            events.put(("done", result))
    except BaseException as e:
        events.put(("error", (f"{type(e).__name__}: {e}", permanent(e))))
        raise
    finally:
        pid_file.unlink(missing_ok=True)
        events.close()
        events.join_thread()


def _follower_main(spec: RunSpec, environ: dict[str, str]) -> None:
    """Process i > 0 of a multi-host learner: takes the steps process 0 announces."""
    signal.signal(signal.SIGTERM, lambda signum, _: sys.exit(128 + signum))
    pid_file = spec.run_dir.resolve() / f"learner.{environ[PROCESS_ID_ENV]}.pid"
    pid_file.write_text(str(os.getpid()))
    try:
        multihost.initialize(spec.learner.hosts, environ)
        learner, checkpoints = build_follower(spec)
        lockstep.follow(learner, checkpoints, spec.learner.minibatches)
    finally:
        pid_file.unlink(missing_ok=True)
