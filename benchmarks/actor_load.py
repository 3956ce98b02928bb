"""The actors under load, in real runs (`tandem run`, the learner on one core, the actors and
the Dask scheduler on the other):

- concurrency: at `--latency` seconds per environment step, one actor process playing
  `--episodes` episodes at once, on a learner heavy enough to need them (the default
  spec's game with a larger model and four passes over each batch): episodes in flight,
  learner busy and the Dask scheduler's CPU, in steady state. With `--learner spec`, the
  spec's own model, one pass a batch and nothing dropped or held back (no staleness bound,
  no admission, no entry filter): the busy that the actors' one core can give this learner
  at most, whatever the pipeline's depth.
- compiles: a `--steps`-step run of the default spec at zero latency, no entry filter (a
  solved game filters nearly every group): the learner's train-step
  compiles (bounded by `learner.buckets`) and the actor engine's (bounded by its slots and
  window, `learner.engine`), as each reports them at the end.
Usage:

    python benchmarks/actor_load.py [--part concurrency compiles] [--latency 2] [--episodes 1600] [--learner heavy|spec]
"""

from __future__ import annotations

import argparse
import re
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil

from harness import emit, run_pinned, steady_rates

SPEC = "specs/guess-number.yaml"
# A train step of ~0.3 s on one core, four per batch: ~1.2 s to take 16 groups.
HEAVY = ["model.d_model=256", "model.n_heads=8", "model.n_kv_heads=4", "model.d_ff=1024", "learner.epochs=4",
         "sync.interval=4", "learner.optimizer.lr=0.0003",
         # An episode of 4 turns at 2 s spans ~7 versions of this learner (one per 1.2 s batch):
         # the spec's budget of 4 would drop nearly every group as stale.
         "buffer.max_staleness=16"]
# The spec's learner fed everything the actors make: its busy is then bounded by their core only.
UNBOUNDED = ["buffer.admission=false", "buffer.max_staleness=null", "buffer.filters=[]"]
LEARNERS = {"heavy": HEAVY, "spec": UNBOUNDED}


def concurrency(latency: float, episodes: int, seconds: float, work: Path, learner: str) -> dict:
    groups = -(-episodes // 8)
    overrides = [*LEARNERS[learner], f"env.latency_s={latency}", f"actors.groups_per_worker={groups}",
                 "actors.slots=1024", "learner.stop_at_success=null", "learner.steps=100000", "checkpoint.every=100000"]
    cpu = _CpuMeter()
    result = run_pinned(SPEC, overrides, work / "concurrency", budget_s=seconds, stop=cpu.watch)
    steady = [r for r in result.records if r["step"] > 5]
    rates = steady_rates(result.records, skip=5)
    trained = sum(len(r["prompt_ids"]) for r in steady)
    return {"learner": learner, "latency_s": latency, "episodes_asked": episodes,
            "episodes_in_flight": float(np.mean([r["in_flight"] for r in steady])) * 8 if steady else None,
            "learner_busy": rates["busy"], "groups_per_s": rates["groups_per_s"],
            # busy = groups/s taken x train seconds a group: the second factor is the learner's
            "train_ms_per_group": 1e3 * sum(r["train_s"] for r in steady) / max(1, trained),
            "steps": len(result.records), "scheduler_cpu_%": cpu.percent()}


class _CpuMeter:
    """The scheduler's CPU over the run's steady part (from its sixth step on): the pool's
    scheduler, a child of this process while the run is on."""

    def __init__(self):
        self.process, self.start = None, None

    def watch(self, records: list[dict]) -> bool:
        if self.process is None:
            self.process = next(p for p in psutil.Process().children() if "scheduler" in " ".join(p.cmdline()))
        if self.start is None and len(records) > 5:
            self.start = (time.monotonic(), self.process.cpu_times())
        self.last = (time.monotonic(), self.process.cpu_times())
        return False

    def percent(self) -> float | None:
        if self.start is None:
            return None
        (t0, c0), (t1, c1) = self.start, self.last
        return 100 * ((c1.user + c1.system) - (c0.user + c0.system)) / (t1 - t0)


def compiles(steps: int, work: Path) -> dict:
    # No entry filter: once the game is solved, zero-variance groups would starve the
    # learner and the run would take far longer than its steps need.
    result = run_pinned(SPEC, ["learner.stop_at_success=null", "buffer.filters=[]", f"learner.steps={steps}",
                               "checkpoint.every=100000"], work / "compiles", budget_s=3600)
    log = (work / "compiles.log").read_text()
    engine = re.findall(r"engine compiles (\{[^}]*\})", log)
    return {"steps": len(result.records), "train_step_compiles": result.records[-1]["compiles"],
            "learner_buckets": 2, "engine_compiles": engine[-1] if engine else "not logged"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", nargs="+", choices=["concurrency", "compiles"], default=["concurrency", "compiles"])
    parser.add_argument("--latency", type=float, default=2.0)
    parser.add_argument("--episodes", type=int, default=1600)
    parser.add_argument("--seconds", type=float, default=120.0, help="concurrency: after the first step")
    parser.add_argument("--steps", type=int, default=1000, help="compiles: the run's steps")
    parser.add_argument("--learner", choices=list(LEARNERS), default="heavy",
                        help="concurrency: a heavy learner, or the spec's fed without bound (module docstring)")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("results") / "actor_load.json")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="tandem-load-") as work:
        if "concurrency" in args.part:
            rows.append(concurrency(args.latency, args.episodes, args.seconds, Path(work), args.learner))
        if "compiles" in args.part:
            rows.append(compiles(args.steps, Path(work)))
    emit("actors under load", rows, args.out, args=vars(args) | {"out": str(args.out)})


if __name__ == "__main__":
    main()
