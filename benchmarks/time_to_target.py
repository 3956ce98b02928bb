"""Wall-clock time to a good agent: synchronous against asynchronous learning, over seeds.

For each cell (a spec at an environment latency) and each mode, `tandem run` is launched
once per seed with the settings `tandem audit` recommends for that mode (`flows.audit`),
the same model, optimizer and group size, the learner pinned to its own core and the
actors (a Dask scheduler and worker started here) to the others. A run stops when the
success rate (the acting policy's, every finished group counted), averaged over the
last 20 steps (20 batches where each is trained for several updates), reaches the
target, or `--cap` seconds after its first step; a run that misses counts as the cap and
is marked. Printed per cell and mode: the median and range of seconds from the first
step to the target, learner busy, the mean staleness of the trained tokens (versions,
optimizer updates), the audit's predicted staleness, and where the learning goes (`WHERE`).

With `--floor`, cells at zero latency also run `benchmarks/single_process.py` (the
in-process batched loop) over the same seeds, for the cost of decoupling. With
`--variant NAME=path=value,...` (repeatable), each mode also runs under those overrides,
seed by seed alternated with the plain settings, so that a machine whose speed drifts
does not favour either. Usage:

    python benchmarks/time_to_target.py [--cells guess-number:0.5 calculator:0.5 guess-number:2]
        [--seeds 3] [--modes sync async] [--cap 480] [--floor] [--set path=value ...]
        [--variant tis=learner.loss.objective=tis,learner.loss.is_cap=2 ...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from flows.spec import load_spec
from harness import ROOT, emit, reached, run_pinned, steady_rates

WINDOW = 20  # steps the success rate is averaged over
# Where the learning goes, per trained step (means after the target's first window): the
# tokens the clip zeroes, those whose importance weight is capped, the effective sample
# size's share, and the success of the groups trained beside that of every group played.
WHERE = ("clip_fraction", "is_capped_fraction", "ess_fraction", "trained_success_rate", "success_rate")
SEEDS = {"guess-number:0.5": 3, "calculator:0.5": 3, "guess-number:2": 2}


def recommended(spec: str, mode: str, latency: float, extra: list[str]) -> tuple[list[str], dict]:
    """The audit's recommended overrides for `mode` at `latency`, and its prediction."""
    out = subprocess.run([sys.executable, "-m", "flows.cli", "audit", spec, "--mode", mode, "--json", "-",
                          "--set", f"env.latency_s={latency}", *[a for o in extra for a in ("--set", o)]],
                         cwd=ROOT, capture_output=True, text=True, check=True)
    audit = json.loads(out.stdout.split("\n--- json\n", 1)[1])
    return audit["recommendation"]["overrides"], audit["recommendation"]


def one_run(spec: str, overrides: list[str], seed: int, cap_s: float, target: float, work: Path) -> dict:
    # A batch trained for several updates records a step each, with the same acting success
    # until the next batch: the window spans WINDOW batches, so as many groups as at one update.
    window = WINDOW * load_spec(ROOT / spec, overrides).learner.updates_per_batch
    result = run_pinned(spec, [*overrides, f"seed={seed}", "learner.stop_at_success=null", "learner.steps=100000",
                               "checkpoint.every=100000"],
                        work / f"seed{seed}", budget_s=cap_s,
                        stop=lambda records: reached(records, target, window) is not None)
    records = result.records
    hit = reached(records, target, window)
    if hit is None and result.stopped_by != "budget":  # it failed: a miss would hide why
        log = (work / f"seed{seed}.log").read_text().splitlines()
        raise RuntimeError(f"{spec} seed {seed} ended ({result.stopped_by}, exit {result.returncode}) before its "
                           "target or the cap:\n" + "\n".join(log[-20:]))
    first = records[0]["time"] if records else None
    trained = records[window:] or records
    return {"seconds": hit["time"] - first if hit else cap_s, "missed": hit is None,
            "busy": steady_rates(records)["busy"],
            "staleness_versions": _mean(trained, "token_staleness_mean"),
            "staleness_updates": _mean(trained, "token_staleness_updates_mean"),
            **{key: _mean(trained, key) for key in WHERE}}


def floor_run(spec: str, seed: int, cap_s: float, target: float) -> dict:
    done = subprocess.run([sys.executable, "benchmarks/single_process.py", spec, "--set", f"seed={seed}",
                           "--target", str(target), "--window", str(WINDOW), "--seconds", str(cap_s)],
                          cwd=ROOT, capture_output=True, text=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return {"seconds": result["seconds"] or cap_s, "missed": result["seconds"] is None}


def summary(cell: str, mode: str, runs: list[dict], predicted: float | None) -> dict:
    seconds = [r["seconds"] for r in runs]
    return {"cell": cell, "mode": mode, "median_s": float(np.median(seconds)), "min_s": min(seconds),
            "max_s": max(seconds), "missed": sum(r["missed"] for r in runs), "seeds": len(runs),
            "busy": _mean(runs, "busy"), "staleness_v": _mean(runs, "staleness_versions"),
            "staleness_u": _mean(runs, "staleness_updates"), "predicted_u": predicted,
            **{key: _mean(runs, key) for key in WHERE}}


def _mean(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return float(np.mean(values)) if values else None


def _variant(text: str) -> tuple[str, list[str]]:
    name, _, sets = text.partition("=")
    if not name or not sets:
        raise argparse.ArgumentTypeError(f"--variant {text!r}: expected NAME=path=value[,path=value...]")
    return name, sets.split(",")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", nargs="+", default=list(SEEDS), help="ENV:LATENCY, ENV a spec in specs/")
    parser.add_argument("--seeds", type=int, default=None, help="seeds per cell (default: 3, or 2 at 2 s)")
    parser.add_argument("--modes", nargs="+", default=["sync", "async"])
    parser.add_argument("--cap", type=float, default=480.0, help="seconds after the first step")
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--floor", action="store_true", help="also the in-process loop, at zero latency")
    parser.add_argument("--set", action="append", default=[], help="overrides for every run")
    parser.add_argument("--variant", action="append", default=[], type=_variant,
                        help="NAME=path=value,path=value: also run each mode under these overrides")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("results") / "time_to_target.json")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="tandem-ttt-") as work:
        for cell in args.cells:
            name, latency = cell.split(":")
            spec, seeds = f"specs/{name}.yaml", args.seeds or SEEDS.get(cell, 3)
            for mode in args.modes:
                variants = {mode: [], **{f"{mode} {variant}": sets for variant, sets in args.variant}}
                advice = {label: recommended(spec, mode, float(latency), [*args.set, *sets])
                          for label, sets in variants.items()}
                by_label = {label: [] for label in variants}
                for seed in range(seeds):
                    for label, sets in variants.items():
                        # The audit's overrides set the pool and pace only: the cell's latency is the run's own.
                        run_overrides = [*advice[label][0], f"env.latency_s={latency}", *args.set, *sets]
                        by_label[label].append(one_run(spec, run_overrides, seed, args.cap, args.target,
                                                       Path(work) / cell / label.replace(" ", "-")))
                for label, runs in by_label.items():
                    rows.append(summary(cell, label, runs, advice[label][1].get("staleness_updates")))
                    print(json.dumps({**rows[-1], "runs": runs}), flush=True)
            if args.floor and float(latency) == 0.0:
                runs = [floor_run(spec, seed, args.cap, args.target) for seed in range(seeds)]
                rows.append(summary(cell, "in-process floor", runs, None))
    emit(f"time to {args.target:.0%} success (seconds after the first step; misses count as {args.cap:.0f})",
         rows, args.out, args=vars(args) | {"out": str(args.out)})


if __name__ == "__main__":
    main()
