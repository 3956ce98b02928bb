"""What the benchmarks share: tables with their machine's state, pinned actor pools, and
`tandem run` launched on chosen cores and watched through its `metrics.jsonl`.

Pinning is done from outside, as on separate hardware: the actors' Dask workers (and
this process, which hosts their scheduler) on one set of cores, the `tandem run`
process tree (the flow and the learner process) on another.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import psutil

ROOT = Path(__file__).resolve().parents[1]
TANDEM = str(Path(sys.executable).parent / "tandem")


def machine() -> dict:
    """What the figures depend on: cores, load (others' work on a shared machine), commit."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return {"cpus": os.cpu_count(), "load_avg": os.getloadavg(), "time": time.strftime("%Y-%m-%d %H:%M:%S"),
            "commit": commit.stdout.strip()}


def emit(title: str, rows: list[dict], out: Path, **meta) -> None:
    """Prints `rows` as a table and writes them, with the machine's state, to `out` (JSON)."""
    columns = list(dict.fromkeys(k for row in rows for k in row))
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    print(f"\n{title}")
    print("  ".join(c.rjust(w) for c, w in zip(columns, widths)))
    for r in cells:
        print("  ".join(v.rjust(w) for v, w in zip(r, widths)))
    record = {"title": title, "machine": machine(), **meta, "rows": rows}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2, default=str) + "\n")
    print(f"(written to {out}; load average now {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def split_cores(learner_cores: int = 1) -> tuple[set[int], set[int]]:
    """(learner cores, actor cores): the last `learner_cores` of this process's, and the rest."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return set(cores), set(cores)
    return set(cores[-learner_cores:]), set(cores[:-learner_cores])


def pin_tree(pid: int, cores: set[int]) -> None:
    """Pins every thread of `pid` and of its descendants; threads they start later inherit it."""
    for process in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]:
        pin_threads(process, cores)


def pin_threads(process: psutil.Process, cores: set[int], only: Callable[[int], bool] = lambda tid: True) -> None:
    """Pins the threads of one process (not its children), those whose id passes `only`."""
    for thread in process.threads():
        if only(thread.id):
            with contextlib.suppress(OSError):  # a thread that just ended
                os.sched_setaffinity(thread.id, cores)


# A run on `actor_pool(..., eval_cores=...)`: the actors on their workers, evaluations on theirs.
EVAL_WORKER = ["actors.resources={actor: 1}", "eval.resources={eval: 1}"]


@contextlib.contextmanager
def actor_pool(cores: set[int], workers: int = 1, threads: int = 2,
               eval_cores: set[int] | None = None) -> Iterator[str]:
    """A Dask scheduler and `workers` worker processes, started as commands pinned to
    `cores` as on machines of their own; yields the scheduler's address. By default each
    worker has two threads, as a local cluster's: one for its actor task (which plays
    every group of the process through one engine), one for other work. With
    `eval_cores`, the actors' workers carry the resource `actor` and one more worker,
    pinned to those cores, `eval`: a run with EVAL_WORKER's overrides evaluates there."""
    from distributed import Client
    from distributed.utils import open_port

    from tasks.actors.cluster import ACTOR_ENV

    # The workers import what a spawned LocalCluster worker would: the repository, and
    # the benchmark scripts' functions pickled by reference to their modules.
    path = os.pathsep.join(filter(None, [str(ROOT), str(ROOT / "benchmarks"), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, **ACTOR_ENV, "PYTHONPATH": path}
    dask = str(Path(sys.executable).parent / "dask")
    port = open_port("127.0.0.1")
    address = f"tcp://127.0.0.1:{port}"
    quiet = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                 preexec_fn=lambda: os.sched_setaffinity(0, cores))
    worker = [dask, "worker", address, "--nworkers", "1", "--no-dashboard", "--no-nanny"]
    processes = [subprocess.Popen([dask, "scheduler", "--host", "127.0.0.1", "--port", str(port),
                                   "--no-dashboard"], **quiet)]
    try:
        tag = ["--resources", "actor=1"] if eval_cores else []
        processes += [subprocess.Popen([*worker, "--nthreads", str(threads), *tag], **quiet) for _ in range(workers)]
        if eval_cores:
            processes.append(subprocess.Popen([*worker, "--nthreads", "1", "--resources", "eval=1"],
                                              **{**quiet, "preexec_fn": lambda: os.sched_setaffinity(0, eval_cores)}))
        with Client(address, timeout=60) as client:
            client.wait_for_workers(workers + bool(eval_cores), timeout=60)
            connect_workers(client)
        yield address
    finally:
        for process in processes[::-1]:
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def run_pinned(spec: str, overrides: list[str], run_dir: Path, *, budget_s: float,
               stop: Callable[[list[dict]], bool] = lambda records: False, eval_worker: bool = False) -> RunResult:
    """`tandem run` laid out as on a cluster: its flow and learner on one core (`split_cores`),
    its actors on a Dask pool of their own pinned to the others (`actor_pool`), started for
    this run and stopped after it; with `eval_worker`, evaluations on a worker of their own
    beside the learner (EVAL_WORKER)."""
    learner_cores, actor_cores = split_cores()
    with actor_pool(actor_cores, eval_cores=learner_cores if eval_worker else None) as address:
        return run_tandem(spec, [*overrides, *(EVAL_WORKER if eval_worker else []), f"actors.cluster={address}"],
                          run_dir, cores=learner_cores, budget_s=budget_s, stop=stop)


def connect_workers(client) -> None:
    """Makes each worker's own client, once: threads of a worker that all call
    `get_client()` first at the same time can fail (distributed asserts in its handshake)."""
    from distributed import get_client

    client.gather([client.submit(lambda: bool(get_client()), workers=[w], pure=False)
                   for w in client.scheduler_info()["workers"]])


@dataclasses.dataclass
class RunResult:
    records: list[dict]  # metrics.jsonl
    launched: float  # epoch seconds
    marks: dict[str, float]  # first stdout line containing each marker -> epoch seconds
    stopped_by: str  # "exit", "target", "budget"
    returncode: int | None


def run_tandem(spec: str, overrides: list[str], run_dir: Path, *, cores: set[int] | None,
               budget_s: float, stop: Callable[[list[dict]], bool] = lambda records: False,
               markers: tuple[str, ...] = (), startup_s: float = 300.0, tree: Path = ROOT) -> RunResult:
    """Runs `tandem run` on `cores` until it exits, `stop(records)`, `budget_s` passes after
    its first step, or `startup_s` passes before it; `tree`: another checkout's code (a git
    worktree) run with this one's environment, its spec paths relative to it.

    A run stopped early is killed with its process group (flow and learner process);
    its Dask actors die with the pool the caller gives each run.
    """
    launcher, env = [TANDEM], None
    if tree != ROOT:  # its modules first on the path, in the flow and in the processes it spawns
        launcher = [sys.executable, "-c", "import sys; from flows.cli import main; sys.exit(main())"]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")]))}
    command = [*launcher, "run", spec, *[a for o in overrides for a in ("--set", o)],
               "--set", f"checkpoint.dir={run_dir}"]
    preexec = (lambda: os.sched_setaffinity(0, cores)) if cores else None
    launched = time.time()
    process = subprocess.Popen(command, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True, preexec_fn=preexec)
    marks: dict[str, float] = {}
    log = run_dir.parent / f"{run_dir.name}.log"
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    reader = threading.Thread(target=_read_lines, args=(process, log, markers, marks), daemon=True)
    reader.start()
    stopped_by, metrics = "exit", run_dir / "metrics.jsonl"
    while process.poll() is None:
        time.sleep(0.5)
        records = _records(metrics)
        started = records[0]["time"] if records else launched + startup_s
        if stop(records):
            stopped_by = "target"
        elif time.time() - started > budget_s:
            stopped_by = "budget" if records else "start-up"
        else:
            continue
        os.killpg(process.pid, signal.SIGKILL)
        break
    process.wait()
    reader.join(timeout=5)
    return RunResult(_records(metrics), launched, marks, stopped_by, process.returncode)


def _read_lines(process, log: Path, markers: tuple[str, ...], marks: dict) -> None:
    with log.open("w") as f:
        for line in process.stdout:
            f.write(line)
            for marker in markers:
                if marker in line and marker not in marks:
                    marks[marker] = time.time()


def _records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    complete = path.read_text().split("\n")[:-1]  # the last line may be half-written
    records = [json.loads(line) for line in complete if line.strip()]
    return [r for r in records if "eval" not in r]  # step records only (not a version's eval)


def rolling_success(records: list[dict], window: int = 5) -> list[float]:
    values = [r.get("success_rate", r["reward_mean"]) for r in records]
    return [float(np.mean(values[max(0, i - window + 1): i + 1])) for i in range(len(values))]


def reached(records: list[dict], target: float, window: int = 5) -> dict | None:
    """The first record where the mean success of the last `window` steps reaches `target`."""
    for record, value in zip(records, rolling_success(records, window)):
        if record["step"] >= window and value >= target:
            return record
    return None


def steady_rates(records: list[dict], skip: int = 3) -> dict:
    """Learner busy and trained groups/s between the end of step `skip` and the last step.

    A batch trained for several steps (learner.epochs, minibatches) repeats its prompt ids:
    its groups are counted once.
    """
    window = records[skip:]
    if len(window) < 2:
        return {"busy": None, "groups_per_s": None, "steps": len(records)}
    wall = window[-1]["time"] - records[skip - 1]["time"]
    batches = [r["prompt_ids"] for prev, r in zip(records[skip - 1:], window) if r["prompt_ids"] != prev["prompt_ids"]]
    return {"busy": sum(r["train_s"] for r in window) / wall,
            "groups_per_s": sum(map(len, batches)) / wall, "steps": len(records)}
