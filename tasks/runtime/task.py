"""The learner task: owns the accelerator for the whole training, in a process of its own.

The task starts a learner process that runs a `Session` and relays its logs and version
records here, where the Prefect context is. If that process dies (an XLA abort, the OOM
killer, a kill -9), the task stops the session's actors and fails; Prefect retries it,
and the new session resumes from the latest checkpoint.
"""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import queue
import uuid

from distributed import Client
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from tasks.buffer.channels import Channels, stop_actors
from tasks.records.artifacts import ProgressRecord, record_version
from tasks.runtime.build import RunSpec, build_session

PID_FILE = "learner.pid"  # in the run directory, while a learner process runs
LOCK_FILE = "learner.lock"  # held (flock) by that process


@task(name="learner", retries=2, retry_delay_seconds=2, cache_policy=NO_CACHE, persist_result=False)
def learn(spec: RunSpec, scheduler_address: str) -> dict:
    """Trains to `learner.steps`, resuming from the run directory's latest checkpoint."""
    log = get_run_logger()
    channels = Channels(uuid.uuid4().hex[:8])
    events = multiprocessing.get_context("spawn").Queue()
    process = multiprocessing.get_context("spawn").Process(
        target=_learner_main, args=(spec, scheduler_address, channels, events), name="tandem-learner")
    process.start()
    try:
        result = _relay(events, process, log, spec)
    finally:
        process.join(timeout=30)
        if process.is_alive():
            process.kill()
    if result is None:
        log.error(f"learner process exited with code {process.exitcode}; stopping its actors")
        with Client(scheduler_address) as client:
            stop_actors(client, channels, spec.actors.n_actors)
        raise RuntimeError(f"learner process died (exit code {process.exitcode})")
    return result


def _relay(events, process, log, spec: RunSpec) -> dict | None:
    """Forwards the process's events until it reports its result or dies."""
    progress = None
    while True:
        try:
            kind, payload = events.get(timeout=1.0)
        except queue.Empty:
            if not process.is_alive():
                return None
            continue
        if kind == "log":
            getattr(log, payload[0])(payload[1])
        elif kind == "version":
            record_version(**payload)
        elif kind == "progress":
            step, version = payload
            if progress is None:
                progress = ProgressRecord(run_name=spec.name, step=step, version=version,
                                          total_steps=spec.learner.steps)
            progress.update(step, version)
        elif kind == "done":
            return payload
        elif kind == "error":
            raise RuntimeError(f"learner failed: {payload}")


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

    def progress(self, step: int, version: int) -> None:
        self._events.put(("progress", (step, version)))


def _learner_main(spec: RunSpec, scheduler_address: str, channels: Channels, events) -> None:
    run_dir = spec.run_dir.resolve()
    pid_file = run_dir / PID_FILE
    # One learner per run directory: a second one (a run started twice) would interleave
    # checkpoints and metrics. The kernel drops the lock when this process dies.
    lock = (run_dir / LOCK_FILE).open("w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        events.put(("error", f"RuntimeError: {run_dir} is in use by another learner "
                             f"(pid {pid_file.read_text() if pid_file.exists() else '?'})"))
        return
    pid_file.write_text(str(os.getpid()))
    try:
        with Client(scheduler_address) as client:
            relay = _Events(events)
            events.put(("done", build_session(spec, client, channels, log=relay, reporter=relay).run()))
    except BaseException as e:
        events.put(("error", f"{type(e).__name__}: {e}"))
        raise
    finally:
        pid_file.unlink(missing_ok=True)
        events.close()
        events.join_thread()
