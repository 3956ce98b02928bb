"""The training flow: the spec, compiled into one Prefect flow run that only wires tasks."""

from __future__ import annotations

import contextlib
import signal
from pathlib import Path

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.states import Cancelled

from flows.evaluate import eval_summary
from flows.report import publish_report
from flows.spec import Spec
from tasks.actors.cluster import actor_cluster
from tasks.runtime.interrupt import INTERRUPT, blocking, reclaim_sigterm
from tasks.runtime.stopping import StopReason
from tasks.runtime.task import learn


@task(cache_policy=NO_CACHE, persist_result=False)
def prepare_run_dir(spec: Spec) -> Path:
    """Creates the run directory and its resolved `spec.yaml`; a resumed run must keep its spec."""
    run_dir = spec.run_dir.resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    spec_file = run_dir / "spec.yaml"
    if spec_file.exists() and spec_file.read_text() != spec.to_yaml():
        get_run_logger().warning(f"{spec_file} differs from this run's spec; the run's spec is replaced")
    spec_file.write_text(spec.to_yaml())
    return run_dir


@flow(name="tandem-train", log_prints=True)
def train(spec: Spec):
    """Trains the spec's agent: actors on Dask stream groups to the learner task. Returns
    where training ended (`step`, `version`, `stopped`, `accounting`); a Cancelled state
    (with that result) if Ctrl-C or SIGTERM stopped it (`tasks.runtime.interrupt`)."""
    reclaim_sigterm()  # from Prefect's engine, under `tandem run`: SIGTERM stops as Ctrl-C does
    run_dir = prepare_run_dir(spec)
    with contextlib.ExitStack() as stack:
        # The actors play on through a Ctrl-C or a SIGTERM, till the learner stops them (tasks.runtime.interrupt).
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
