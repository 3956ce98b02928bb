"""(d) Actor pool scaling: trained groups/s and learner busy against the number of actors,
next to what `tandem audit` predicts for each pool.

The audit's measurements are taken once, in this process pinned to the learner's core
(its learner step and its actors' compute are what the runs will see); then for each
pool size the spec runs asynchronously through `tandem run` (learner pinned to its
core, actors to the others) for `--seconds`, and the steady-state rates are compared
with `flows.audit.predict` for that pool. The group-compute cap uses the actors' cores.
Same model and batch as benchmarks/sync_vs_async.py. Usage:

    python benchmarks/actor_scaling.py [--quick] [--actors 1 2 4 8 16 32 64] [--latency 0.5] [--seconds 90]
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from harness import actor_pool, emit, run_tandem, split_cores, steady_rates
from sync_vs_async import BENCH, SPEC

from flows.audit import Pool, predict
from flows.spec import load_spec
from tasks.measure import measure


def audit(overrides: list[str], learner_cores: set[int]):
    """The audit's measurements of the benchmark spec, taken on the learner's core."""
    everywhere = os.sched_getaffinity(0)
    os.sched_setaffinity(0, learner_cores)
    try:
        return measure(load_spec(SPEC, overrides), groups=12, train_steps=5)
    finally:
        os.sched_setaffinity(0, everywhere)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="pools of 2, 8 and 24 actors, 40 s a run")
    parser.add_argument("--actors", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    parser.add_argument("--latency", type=float, default=0.5, help="env.latency_s")
    parser.add_argument("--workers", type=int, default=2, help="actor processes (actors are their threads)")
    parser.add_argument("--seconds", type=float, default=90.0, help="budget of one run after its first step")
    parser.add_argument("--set", action="append", default=[], help="further spec overrides")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("results") / "actor_scaling.json")
    args = parser.parse_args()
    if args.quick:
        args.actors, args.seconds = [2, 8, 24], 40.0
    overrides = [*BENCH, "learner.mode=async", f"env.latency_s={args.latency}", *args.set]
    learner_cores, actor_cores = split_cores()
    m = audit(overrides, learner_cores)
    spec = load_spec(SPEC, overrides)
    rows = []
    with tempfile.TemporaryDirectory(prefix="tandem-bench-") as work:
        for actors in args.actors:
            pool = Pool(actors, len(actor_cores), spec.learner.batch_groups, spec.sync.interval,
                        spec.learner.updates_per_batch)
            p = predict(m, pool)
            with actor_pool(actors, actor_cores, args.workers) as address:
                result = run_tandem(SPEC, [*overrides, f"actors.actors={actors}", f"actors.cluster={address}"],
                                    Path(work) / f"actors-{actors}", cores=learner_cores, budget_s=args.seconds)
            rates = steady_rates(result.records)
            busy = rates["busy"]
            rows.append({"actors": actors, "groups/s": rates["groups_per_s"],
                         "predicted groups/s": p.groups_per_s_async, "busy": busy,
                         "predicted busy": p.busy_async,
                         "error (points)": None if busy is None else 100 * (p.busy_async - busy),
                         "steps": rates["steps"]})
            print(rows[-1], flush=True)
    emit(f"actor scaling at {args.latency} s/step: {SPEC} with {' '.join(overrides)}; actors on cores "
         f"{sorted(actor_cores)}, learner on {sorted(learner_cores)}", rows, args.out,
         audit=m.to_json(), args=vars(args) | {"out": str(args.out)})


if __name__ == "__main__":
    main()
