"""(a) Synchronous against asynchronous learning on the same spec, at growing env latency.

For each `env.latency_s` (seconds per environment step) it runs the spec through
`tandem run` in each mode, `learner.mode: sync` (play a batch with the latest weights,
train, publish) and `async`, with the same learner batch and the same actor pool, the
learner pinned to its own core and the actors to the others. Each run stops at the reward target or after
`--seconds`. Reported per cell: learner busy and trained groups/s in steady state (after
the first steps, which compile), the wall time from the first step to the target (mean
success over 5 steps), and the success gained per wall-clock second of training.

The model is larger than the demo's and each batch is trained for 4 epochs, so that a
batch takes ~0.3-0.4 s on one core, "busy" measures something, and one actor core can
feed it (see BENCH); checkpoints are written only at the end (`checkpoint.every`).
The default pool is sized by `tandem audit` for 90% busy at 0.5 s/step on such a machine;
run `tandem audit` with the same --set values to size it for yours.

A third mode, async-bounded, is async with admission control (`buffer.admission`,
`buffer.max_staleness` --max-staleness): where the actors outpace the learner, unbounded
async trains on groups many versions old, and this shows what bounding that costs. Usage:

    python benchmarks/sync_vs_async.py [--quick] [--latencies 0 0.1 0.5 2] [--actors 48] [--seconds 150]
                                       [--modes sync async async-bounded] [--max-staleness 4]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from harness import actor_pool, emit, reached, rolling_success, run_tandem, split_cores, steady_rates

SPEC = "specs/guess-number.yaml"
MODES = ("sync", "async", "async-bounded")
# A train step of ~70-100 ms on one core, four updates per batch, one version per batch:
# an actor's compute per group (~20 ms of small jitted calls, plus its Dask round trips) is
# then small enough that one actor core can feed one learner core.
BENCH = ["model.d_model=256", "model.n_heads=8", "model.n_kv_heads=4", "model.d_ff=1024",
         "learner.optimizer.lr=0.0003", "learner.batch_groups=4", "learner.epochs=4",
         "learner.steps=100000", "buffer.capacity=8", "sync.interval=4",
         "checkpoint.every=100000", "checkpoint.keep=1"]


def cell(mode: str, latency: float, args, learner_cores, actor_cores, work: Path) -> dict:
    overrides = [*BENCH, f"learner.mode={mode.removesuffix('-bounded')}", f"env.latency_s={latency}",
                 f"actors.actors={args.actors}", *args.set]
    if mode == "async-bounded":  # admission control: no group starts that would exceed the budget
        overrides += ["buffer.admission=true", f"buffer.max_staleness={args.max_staleness}"]
    with actor_pool(args.actors, actor_cores, args.workers) as address:
        result = run_tandem(SPEC, [*overrides, f"actors.cluster={address}"], work / f"{mode}-{latency}",
                            cores=learner_cores, budget_s=args.seconds,
                            stop=lambda records: reached(records, args.target) is not None)
    records = result.records
    rates = steady_rates(records)
    hit = reached(records, args.target)
    first = records[0]["time"] if records else None
    trained_s = records[-1]["time"] - first if len(records) > 1 else None
    success = rolling_success(records)
    return {"latency_s": latency, "mode": mode, "busy": rates["busy"], "groups/s": rates["groups_per_s"],
            "steps": rates["steps"], "to_target_s": hit["time"] - first if hit else None,
            "success_end": success[-1] if success else None,
            "success_per_s": (success[-1] - success[0]) / trained_s if trained_s else None,
            "staleness_max": max((r["staleness_max"] for r in records), default=None),
            "stopped_by": result.stopped_by}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="latencies 0 and 0.5, 24 actors, 40 s a run")
    parser.add_argument("--latencies", type=float, nargs="+", default=[0.0, 0.1, 0.5, 2.0])
    parser.add_argument("--actors", type=int, default=48)
    parser.add_argument("--workers", type=int, default=2, help="actor processes (actors are their threads)")
    parser.add_argument("--seconds", type=float, default=150.0, help="budget of one run after its first step")
    parser.add_argument("--target", type=float, default=0.9, help="success rate to reach")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--max-staleness", type=int, default=4, help="the budget of async-bounded")
    parser.add_argument("--set", action="append", default=[], help="further spec overrides")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("results") / "sync_vs_async.json")
    args = parser.parse_args()
    if args.quick:
        args.latencies, args.actors, args.seconds = [0.0, 0.5], 24, 40.0
    learner_cores, actor_cores = split_cores()
    rows = []
    with tempfile.TemporaryDirectory(prefix="tandem-bench-") as work:
        for latency in args.latencies:
            for mode in args.modes:
                rows.append(cell(mode, latency, args, learner_cores, actor_cores, Path(work)))
                print(rows[-1], flush=True)
    for latency in args.latencies:
        cells = {r["mode"]: r for r in rows if r["latency_s"] == latency}
        baseline = cells.get("sync", {}).get("groups/s")
        for mode in ("async", "async-bounded"):
            if baseline and cells.get(mode, {}).get("groups/s"):
                cells[mode]["speed-up"] = cells[mode]["groups/s"] / baseline
    emit(f"sync vs async: {SPEC} with {' '.join(BENCH + args.set)}; {args.actors} actors on cores "
         f"{sorted(actor_cores)}, learner on {sorted(learner_cores)}", rows, args.out,
         args=vars(args) | {"out": str(args.out)})


if __name__ == "__main__":
    main()
