"""The warm-up task: the warm-up (`tasks.warmup.stage`) in a process of its own, which
holds the accelerator until it exits, before the learner's takes it.

Its logs come to Prefect through the task; its demonstrations and its last checkpoint are
assets, upstream of the run's first version (`tasks.records.artifacts`). A Ctrl-C (or
SIGTERM) stops it at its next update, checkpointed; a second one at once. If the process
dies, Prefect retries the task, which resumes from the latest warm-up checkpoint. A
warm-up already finished (a resumed run) is not run again.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import traceback

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from learner.config import FieldError
from tasks.records.artifacts import demonstrations_key, record_warmup
from tasks.run_dir import RunDir
from tasks.runtime.processes.hosts import AT_ONCE
from tasks.runtime.processes.interrupt import INTERRUPT, blocking
from tasks.runtime.processes.relay import EventReader
from tasks.runtime.processes.task import retriable, end_with_parent, permanent, take_signals
from tasks.runtime.session.failures import LearnerFailed, LearnerFailedUnrecoverably
from tasks.warmup.stage import WarmupSpec, warm_up

AT_ONCE_S = 5.0  # told to stop at once and still running after this (in a compile, say): killed


@task(name="warm-up", retries=2, retry_delay_seconds=2, retry_condition_fn=retriable, cache_policy=NO_CACHE,
      persist_result=False)
def warmup(spec: WarmupSpec, run_name: str) -> dict:
    """Fine-tunes on the warm-up's demonstrations to `warmup.steps`, resuming its latest checkpoint."""
    log = get_run_logger()
    run_dir = RunDir(spec.run_dir.resolve())
    if (done := run_dir.warmed_up()) is not None:
        log.info(f"the warm-up has finished already (update {done.name}): version 0 is its weights")
        return {"stopped": "steps", "step": int(done.name), "checkpoint": str(done)}
    context = multiprocessing.get_context("spawn")
    events, stop = EventReader(), context.Event()
    process = context.Process(target=_main, name="tandem-warmup", args=(spec, events.writer, stop))
    with blocking(signal.SIGINT, signal.SIGTERM):
        process.start()
    events.started()
    result, asked = None, 0
    try:
        while True:
            if INTERRUPT.count > asked:  # Ctrl-C: the next update; twice: at once
                asked = INTERRUPT.count
                stop.set()
                if asked > 1:
                    os.kill(process.pid, AT_ONCE)
            event = events.get(0.5)
            if event is None:
                if events.gone:
                    break
                continue
            kind, payload = event
            if kind == "log":
                log.info(payload)
            elif kind == "done":
                result = payload
            elif kind == "error":
                message, unrecoverable = payload
                raise (LearnerFailedUnrecoverably if unrecoverable else LearnerFailed)(f"the warm-up failed: {message}")
    finally:
        process.join(AT_ONCE_S if result is None else None)
        if process.is_alive():
            process.kill()
            process.join()
        events.close()
    if result is None:
        raise LearnerFailed(f"the warm-up process died (exit code {process.exitcode}); "
                            f"its log: {run_dir.log}")
    if result["stopped"] == "steps":
        record_warmup(run_name=run_name, spec_path=run_dir.spec,
                      data_key=demonstrations_key(spec.warmup.source, spec.env.entrypoint, spec.seed),
                      checkpoint=run_dir.warmup_checkpoints / str(result["step"]), metrics=result)
    return result


class _Log:
    def __init__(self, events):
        self.events = events

    def __call__(self, message: str) -> None:
        self.events.put(("log", message))


def _main(spec: WarmupSpec, events, stop) -> None:
    run_dir = RunDir(spec.run_dir.resolve())
    sigterm = take_signals(AT_ONCE, leader=True)
    end_with_parent(AT_ONCE, run_dir.warmup / "warmup.pid")
    failed = False
    try:
        result = warm_up(spec, _Log(events), interrupted=lambda: stop.is_set() or sigterm())
        events.put(("done", result))
    except Exception as e:
        # A demonstration the spec's data cannot give (FieldError) fails every retry alike.
        events.put(("error", (f"{type(e).__name__}: {e}", permanent(e) or isinstance(e, FieldError))))
        with run_dir.log.open("a") as f:
            f.write(f"warm-up process {os.getpid()} failed:\n{traceback.format_exc()}")
        failed = True
    finally:
        events.close()
        events.join_thread()
    if failed:
        sys.exit(1)
