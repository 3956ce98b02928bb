"""(i) Evaluation's cost beside training: the learner's step rate of the default spec with
and without `eval.every`, alternated, and the CPU time each process of the run spent
(the flow and its task, the learner process, the actors' workers, the Prefect server),
so that the difference says where an evaluation's cost goes. With `--eval-worker` (pinned),
evaluations play on a worker of their own beside the learner (`eval.resources`), as on
a cluster where the learner's host has CPU to spare, instead of beside the actor.
`--part task-runs` measures apart what Prefect costs per task run: the server's CPU and
this process's for a plain task run and for an evaluation's (`evaluate_version`: its asset,
lineage and results recorded, the play on the cluster replaced by a fixed outcome). Usage:

    python benchmarks/eval_cost.py [--runs 2] [--steps 150] [--every 5] [--frozen]
                                   [--pinned [--eval-worker]] [--out PATH]
    python benchmarks/eval_cost.py --part task-runs [--task-runs 40]
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

import psutil
from harness import ROOT, TANDEM, emit, run_pinned, run_tandem, steady_rates

SPEC = "specs/guess-number.yaml"
FROM_STEP = 60  # the steady part: compiles and the first evaluations' are behind


def _kind(process: psutil.Process) -> str:
    command = " ".join(process.cmdline())
    if "prefect" in command and "server" in command:
        return "prefect server"
    if TANDEM in command:
        return "flow"
    if "dask worker" in command or "dask scheduler" in command:  # --pinned: started by the benchmark
        if "worker" not in command:
            return "scheduler"
        return "eval worker" if "eval=1" in command else "workers"
    if "spawn_main" in command:
        return "spawned"  # the learner process and the cluster's workers, told apart below
    return "other"


class CpuMeter:
    """Samples the CPU seconds spent by every process of the machine that belongs to the
    run: `tandem run`'s tree and the Prefect server it uses (its share since the start)."""

    def __init__(self):
        self._kinds: dict[int, str] = {}
        self.spent: dict[int, float] = {}  # CPU seconds since the meter started, by process
        self._start: dict[int, float] = {}
        self._stop = threading.Event()
        self._before = {p.pid for p in psutil.process_iter()}
        self._server = next((p.pid for p in psutil.process_iter() if _kind(p) == "prefect server"), None)
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(0.5):
            for process in psutil.process_iter():
                try:
                    kind = self._kinds.get(process.pid) or self._classify(process)
                    if kind is None:
                        continue
                    self._kinds[process.pid] = kind
                    seconds = _cpu(process)
                    self._start.setdefault(process.pid, seconds if process.pid in self._before else 0.0)
                    self.spent[process.pid] = seconds - self._start[process.pid]
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    continue

    def _classify(self, process: psutil.Process) -> str | None:
        """The process's part in the run, or None if it has none (yet). The learner process
        and the Dask workers are both spawned by the flow: the learner is the one writing
        TensorBoard events (from its first step), a worker one that listens and has not
        written them 20 s after it began."""
        if process.pid in self._before and process.pid != self._server:
            return None
        kind = _kind(process)
        if kind == "spawned":
            if any("tfevents" in f.path for f in process.open_files()):
                return "learner"
            listens = any(c.status == psutil.CONN_LISTEN for c in process.net_connections("tcp"))
            return "workers" if listens and process.create_time() < time.time() - 20 else None
        return None if kind == "other" else kind

    def by_kind(self) -> dict[str, float]:
        totals: dict[str, float] = defaultdict(float)
        for pid, seconds in self.spent.items():
            totals[self._kinds[pid]] += seconds
        return dict(totals)


def one_run(every: int | None, steps: int, work: Path, frozen: bool, pinned: bool, eval_worker: bool) -> dict:
    overrides = ["learner.stop_at_success=null", f"learner.steps={steps}"]
    if frozen:  # the policy barely moves: every step plays alike, and the runs differ only by the evaluations
        overrides.append("learner.optimizer.lr=1e-9")
    if every is not None:
        overrides.append(f"eval.every={every}")
    with CpuMeter() as meter:
        if pinned:  # as on a cluster: the flow and learner on a core, the actors on the other(s)
            result = run_pinned(SPEC, overrides, work, budget_s=900, eval_worker=eval_worker)
        else:
            result = run_tandem(SPEC, overrides, work, cores=None, budget_s=900)
    records = [r for r in result.records if r["step"] >= FROM_STEP]
    wall = records[-1]["time"] - records[0]["time"]
    evals = sum(1 for line in (work / "metrics.jsonl").read_text().splitlines() if '"eval"' in line)
    cpu = meter.by_kind()
    return {"eval.every": every or "off", "steps/s": (len(records) - 1) / wall,
            "busy": steady_rates(records, skip=1)["busy"],
            "evals": evals, **{f"cpu {k} s": round(v, 1) for k, v in sorted(cpu.items())},
            "cpu all s": round(sum(cpu.values()), 1)}


def task_run_costs(n: int, work: Path) -> list[dict]:
    """CPU ms per task run (module docstring), each kind after one warm-up run."""
    from prefect import flow, task
    from prefect.cache_policies import NO_CACHE
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.server import start_local_server
    from learner.config import ModelConfig
    from tasks.config import ActorsConfig, EnvConfig, EvalConfig
    from tasks.eval import task as eval_task
    from tasks.eval.play import EvalSetup

    api_url, _ = start_local_server()
    server = next(p for p in psutil.process_iter() if _kind(p) == "prefect server")
    (work / "spec.yaml").write_text("name: task-runs\n")
    setup = EvalSetup(EvalConfig(every=1), EnvConfig(), ActorsConfig(), ModelConfig(), ("p",))
    outcome = {"scores": {"prompts": 1, "episodes": 1, "success_rate": 1.0, "reward_mean": 1.0}, "episodes": []}
    eval_task.play_on_cluster = lambda *args: outcome  # Prefect's part and the recording only

    @task(cache_policy=NO_CACHE, persist_result=False)
    def plain(i: int) -> int:
        return i

    def evaluation(i: int) -> dict:
        target = eval_task.EvalTarget("task-runs", work, i, i, None)
        return eval_task.evaluate_version(setup, eval_task.EvalCluster("unused"), target, b"")

    @flow
    def measure(kind: str) -> dict:
        run = plain if kind == "plain task" else evaluation
        run(-1)
        time.sleep(3)  # the warm-up's events ingested
        start = [_cpu(server), _cpu(psutil.Process())]
        for i in range(n):
            run(i)
            time.sleep(0.05)
        time.sleep(5)  # the server ingests the last events
        return {"task run": kind, "server ms": 1e3 * (_cpu(server) - start[0]) / n,
                "this process ms": 1e3 * (_cpu(psutil.Process()) - start[1]) / n}

    with temporary_settings(updates={PREFECT_API_URL: api_url}):
        return [measure(kind) for kind in ("plain task", "evaluation", "plain task", "evaluation")]


def _cpu(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=2, help="runs of each setting, alternated")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--every", type=int, default=5)
    parser.add_argument("--frozen", action="store_true",
                        help="learning rate 1e-9: the same work every step, so that the runs differ in "
                             "the evaluations only (a learning run's step rate varies with its success)")
    parser.add_argument("--pinned", action="store_true",
                        help="the flow and learner on one core, the actors (a Dask scheduler and worker "
                             "started here) on the others, as on a cluster")
    parser.add_argument("--eval-worker", action="store_true",
                        help="with --pinned: evaluations on a worker of their own, pinned with the learner")
    parser.add_argument("--part", choices=["step-rate", "task-runs"], default="step-rate")
    parser.add_argument("--task-runs", type=int, default=40, help="task-runs: runs of each kind")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "eval_cost.json")
    args = parser.parse_args()
    if args.part == "task-runs":
        with tempfile.TemporaryDirectory(prefix="tandem-task-runs-") as tmp:
            rows = task_run_costs(args.task_runs, Path(tmp))
        emit(f"Prefect's CPU per task run ({args.task_runs} of each kind, twice, alternated)", rows, args.out)
        return
    if args.eval_worker and not args.pinned:
        parser.error("--eval-worker places a worker by pinning: it needs --pinned")
    rows = []
    with tempfile.TemporaryDirectory(prefix="tandem-eval-cost-") as tmp:
        for i in range(args.runs):
            for every in ((None, args.every) if i % 2 == 0 else (args.every, None)):  # neither always first
                rows.append(one_run(every, args.steps, Path(tmp) / f"{every or 'off'}-{i}", args.frozen,
                                    args.pinned, args.eval_worker))
                print(rows[-1], flush=True)
                time.sleep(2)
    emit(f"Evaluation's cost: steps {FROM_STEP}-{args.steps} of {SPEC}{' (frozen policy)' if args.frozen else ''}, "
         f"eval off and every {args.every}{', pinned' if args.pinned else ''}"
         f"{', an eval worker beside the learner' if args.eval_worker else ''}", rows, args.out,
         frozen=args.frozen, pinned=args.pinned, eval_worker=args.eval_worker)


if __name__ == "__main__":
    main()
