"""The training flow: the spec, compiled into one Prefect flow run that only wires tasks."""

from __future__ import annotations

import contextlib
import signal
import uuid
from pathlib import Path
from typing import Callable

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.client.orchestration import get_client
from prefect.exceptions import ObjectNotFound
from prefect.runtime import flow_run
from prefect.states import Cancelled, Crashed

from flows.evaluate import eval_summary
from flows.report import publish_report
from flows.spec import Spec
from flows.spec_changes import changes_from, described, fixed, with_history
from tasks.actors.cluster import actor_cluster
from tasks.records.atomic import write_text_atomic
from tasks.run_dir import RunDir
from tasks.runtime.session.failures import Unrecoverable
from tasks.runtime.processes.interrupt import INTERRUPT, blocking, reclaim_sigterm
from tasks.runtime.session.stopping import StopReason
from tasks.runtime.processes.task import learn, run_dir_locked
from tasks.warmup.task import warmup


@task(cache_policy=NO_CACHE, persist_result=False)
def prepare_run_dir(spec: Spec, log: Callable[[str], None] = print) -> Path:
    """Creates the run directory and its resolved `spec.yaml`. A run's spec changes only
    as `flows.spec_changes` allows, each change kept in the file's history; a change it
    refuses fails here, before anything in the directory changes."""
    run_dir = spec.run_dir.resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    spec_file, text = RunDir(run_dir).spec, spec.to_yaml()
    if not spec_file.exists():
        write_text_atomic(spec_file, text)
        return run_dir
    previous = spec_file.read_text()
    changes = changes_from(previous, text)
    if refused := fixed(changes):
        raise Unrecoverable(f"{spec_file}: a resumed run keeps what its checkpoints and ledger were made with; "
                            f"this spec changes {', '.join(path for path, _, _ in refused)}")
    if changes:
        log(f"the run's spec changes:\n{described(changes)}")
        write_text_atomic(spec_file, with_history(previous, changes, text))
    return run_dir


@flow(name="tandem-train", log_prints=True)
def train(spec: Spec):
    """Trains the spec's agent: a warm-up first if the spec has one, then actors on Dask
    stream groups to the learner task. Returns
    where training ended (`step`, `version`, `stopped`, `accounting`); a Cancelled state
    (with that result) if Ctrl-C or SIGTERM stopped it (`tasks.runtime.processes.interrupt`)."""
    reclaim_sigterm()  # from Prefect's engine, under `tandem run`: SIGTERM stops as Ctrl-C does
    run_dir = prepare_run_dir(spec, log=get_run_logger().info)
    _take_over(run_dir, log=get_run_logger().warning)
    if spec.warmup is not None:  # its last checkpoint is version 0 (`tasks.warmup`)
        warmed = warmup(spec, spec.name)
        if INTERRUPT.is_set() or warmed["stopped"] != "steps":
            return Cancelled(message=f"Stopped in the warm-up at update {warmed['step']} of {spec.warmup.steps} "
                             f"(checkpointed); `tandem resume {run_dir}` continues it", data=warmed)
    with contextlib.ExitStack() as stack:
        # The actors play on through a Ctrl-C or a SIGTERM, till the learner stops them (tasks.runtime.processes.interrupt).
        with blocking(signal.SIGINT, signal.SIGTERM):
            address = stack.enter_context(actor_cluster(spec.actors))
        # Stopped while the cluster started: nothing trained, nothing to stop.
        result = ({"stopped": "at once", "message": "before training started"} if INTERRUPT.is_set()
                  else learn(spec, address))
    # A learner process sent SIGTERM of its own (a Slurm job step signals every process) stops as interrupted.
    if INTERRUPT.is_set() or result["stopped"] == StopReason.INTERRUPTED.value:
        # Out quickly: `tandem report` plots the run when asked.
        return Cancelled(message=f"{ended(result)}; `tandem resume {run_dir}` continues it", data=result)
    publish_report(run_dir, run_name=spec.name, markdown=_summary(spec, run_dir, result))
    return result


def _take_over(run_dir: Path, log: Callable[[str], None]) -> None:
    """Records this flow run as the run directory's. The one recorded before, if Prefect
    still shows it running while no learner holds the directory, was killed (SIGKILL, a
    machine lost) before it could say so: it is marked Crashed, so the UI tells the truth."""
    path = RunDir(run_dir).flow_run
    previous = path.read_text().strip() if path.is_file() else None
    current = str(flow_run.id)
    if previous and previous != current and not run_dir_locked(run_dir):
        try:
            with get_client(sync_client=True) as client:
                orphan = client.read_flow_run(uuid.UUID(previous))
                if orphan.state is not None and (orphan.state.is_running() or orphan.state.is_pending()):
                    client.set_flow_run_state(orphan.id, Crashed(
                        message="its process was killed before it could report; a later run took its run directory "
                                f"over: flow run {current}"), force=True)
                    log(f"flow run {orphan.name!r}, left {orphan.state.name} by a killed process, is marked Crashed")
        except (ObjectNotFound, ValueError):  # another server's, or not an id: nothing here to mend
            pass
    write_text_atomic(path, current + "\n")


def ended(result: dict) -> str:
    """Where and why training ended, in one line: "Stopped on a plateau at step 310, version 310 (...)"."""
    if "step" not in result:
        return f"Stopped at once ({result.get('message', 'Ctrl-C twice')})"
    reason = StopReason(result["stopped"])
    told = result.get("message") and reason not in (StopReason.STEPS, StopReason.INTERRUPTED)
    why = f" ({result['message']})" if told else ""
    return f"{reason.phrase} at step {result['step']}, version {result['version']}{why}"


def _summary(spec: Spec, run_dir: Path, result: dict) -> str:
    acc = result["accounting"]
    excluded = "".join(f"| {reason} | {n} |\n" for reason, n in sorted(acc["excluded"].items())) or "| none | 0 |\n"
    return (f"# {spec.name}\n\n{ended(result)}.\n\nRun directory: `{run_dir}`\n\n"
            f"| groups started | in flight | buffered | consumed | excluded | retried |\n"
            f"|---|---|---|---|---|---|\n| {acc['started']} | {acc['in_flight']} | {acc['buffered']} | "
            f"{acc['consumed']} | {sum(acc['excluded'].values())} | {acc['retried']} |\n\n"
            f"| excluded because | groups |\n|---|---|\n{excluded}" + eval_summary(run_dir))
