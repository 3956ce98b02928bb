"""Does a run end by itself, and reach its target? Each spec over seeds, as a user runs it.

For every spec and seed, `tandem run SPEC --set seed=K` runs with the spec's own settings
(the local cluster, its latency, its stop rules) until it exits by itself; `--cap`
seconds after its first step it is killed and counted as a run that did not end.
Printed per run: how it ended (the stop reason and exit code), whether it reached its
success target, the seconds from its first step to the target (the step where the run
stopped at `learner.stop_at_success`), the final entropy of the trained tokens, the
longest wait for a batch (`take_s`) and the steps. Per spec: how many seeds reached the
target, the median and range of their seconds, and how many ended by themselves.
Usage:

    python benchmarks/reliability.py [--specs guess-number calculator code-exec] [--seeds 10]
        [--set path=value ...] [--variant NAME=path=value,...] [--cap 600]

`--floor` runs each seed also through `benchmarks/floor.py` (the same spec and overrides,
its target the spec's `learner.stop_at_success`), alternated with Tandem's run of that
seed, and prints the ratio of the two medians: Tandem's distance from the tight floor.

`--variant` runs each seed again under those overrides (alternated with the plain
settings), e.g. games nobody tuned on (`benchmarks/games/`):

    --variant "recall=env.entrypoint=games.recall:Recall;env.kwargs={symbols: abcdef, length: 3}"
    --variant "guess16=env.kwargs={values: 16, max_guesses: 5};model.tokenizer.alphabet=abcdefghijklmnop:<>=?"
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from harness import ROOT, emit, run_tandem

sys.path.insert(0, str(ROOT))
from flows.spec import load_spec  # noqa: E402  (the checkout's, beside this script)
from tasks.run_dir import RunDir  # noqa: E402


# The runs' Dask workers import `games.*` from here, as they would a user's environment module.
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "benchmarks"), os.environ.get("PYTHONPATH")]))


def one_run(spec: str, overrides: list[str], seed: int, cap_s: float, work: Path) -> dict:
    run_dir = work / f"seed{seed}"
    result = run_tandem(spec, [*overrides, f"seed={seed}"], run_dir, cores=None, budget_s=cap_s)
    records, accounting = result.records, _accounting(run_dir)
    stopped = (accounting.get("stopped") or {}).get("reason") if result.stopped_by == "exit" else "killed at cap"
    first = records[0]["time"] if records else None
    reached = stopped == "success"
    return {"seed": seed, "ended": stopped or f"exit {result.returncode}", "exit": result.returncode,
            "reached": reached, "seconds": records[-1]["time"] - first if reached else None,
            "steps": records[-1]["step"] if records else 0,
            "final_success": _last(records, "success_rate"), "final_entropy": _last(records, "entropy"),
            "max_take_s": max((r["take_s"] for r in records), default=None),
            # After the first step, whose wait includes the actors' start (their engine compiles).
            "max_take_s_later": max((r["take_s"] for r in records[1:]), default=None)}


def floor_run(spec: str, overrides: list[str], seed: int, cap_s: float) -> dict:
    """`benchmarks/floor.py` on one seed, in a process of its own on one device (all cores)."""
    target = load_spec(ROOT / spec, overrides).learner.stop_at_success or 0.9
    command = [sys.executable, str(ROOT / "benchmarks" / "floor.py"), str(ROOT / spec),
               *[a for o in overrides for a in ("--set", o)], "--seeds", str(seed), "--target", str(target),
               "--seconds", str(cap_s)]
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "XLA_FLAGS": ""})
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode or not lines:
        raise RuntimeError(f"floor.py failed ({result.returncode}): {result.stderr[-2000:]}")
    run = lines[-1]
    return {"seed": seed, "ended": "target" if run["reached"] else "budget", "exit": 0, "reached": run["reached"],
            "seconds": run["seconds"], "steps": run["steps"], "final_success": None,
            "final_entropy": run["final_entropy"], "max_take_s": None, "max_take_s_later": None}


def summary(label: str, runs: list[dict]) -> dict:
    seconds = [r["seconds"] for r in runs if r["reached"]]
    return {"spec": label, "seeds": len(runs), "reached": len(seconds),
            "ended_by_itself": sum(r["ended"] != "killed at cap" for r in runs),
            "median_s": float(np.median(seconds)) if seconds else None,
            "min_s": min(seconds, default=None), "max_s": max(seconds, default=None),
            "final_entropy_median": float(np.median([r["final_entropy"] for r in runs if r["final_entropy"] is not None]
                                                    or [np.nan])),
            "max_take_s_later": max((r["max_take_s_later"] or 0.0 for r in runs), default=None),
            "how_ended": dict(sorted({e: sum(r["ended"] == e for r in runs) for e in {r["ended"] for r in runs}}.items()))}


def _accounting(run_dir: Path) -> dict:
    path = RunDir(run_dir).accounting
    return json.loads(path.read_text()) if path.exists() else {}


def _last(records: list[dict], key: str) -> float | None:
    values = [r[key] for r in records if r.get(key) is not None]
    return float(values[-1]) if values else None


def _variant(text: str) -> tuple[str, list[str]]:
    name, _, sets = text.partition("=")
    if not name or not sets:
        raise argparse.ArgumentTypeError(f"--variant {text!r}: expected NAME=path=value[;path=value...]")
    return name, sets.split(";")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--specs", nargs="+", default=["guess-number", "calculator", "code-exec"])
    parser.add_argument("--seeds", type=int, default=10, help="seeds 0..N-1")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--cap", type=float, default=600.0, help="seconds after the first step")
    parser.add_argument("--set", action="append", default=[], help="overrides for every run")
    parser.add_argument("--variant", action="append", default=[], type=_variant,
                        help="NAME=path=value;path=value: each seed also runs under these overrides")
    parser.add_argument("--floor", action="store_true", help="also run each seed through benchmarks/floor.py")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("results") / "reliability.json")
    args = parser.parse_args()
    rows, runs_by_label = [], {}
    with tempfile.TemporaryDirectory(prefix="tandem-reliability-") as work:
        for name in args.specs:
            variants = {name: [], **{f"{name} {label}": sets for label, sets in args.variant}}
            for seed in range(args.first_seed, args.first_seed + args.seeds):
                for label, sets in variants.items():
                    run = one_run(f"specs/{name}.yaml", [*args.set, *sets], seed, args.cap,
                                  Path(work) / label.replace(" ", "-"))
                    runs_by_label.setdefault(label, []).append(run)
                    print(json.dumps({"spec": label, **run}), flush=True)
                    if args.floor:
                        floor = floor_run(f"specs/{name}.yaml", [*args.set, *sets], seed, args.cap)
                        runs_by_label.setdefault(f"{label} floor", []).append(floor)
                        print(json.dumps({"spec": f"{label} floor", **floor}), flush=True)
            for label in variants:
                rows.append(summary(label, runs_by_label[label]))
                if args.floor:
                    rows.append(summary(f"{label} floor", runs_by_label[f"{label} floor"]))
                    ours, floor = rows[-2]["median_s"], rows[-1]["median_s"]
                    rows[-1]["tandem_over_floor"] = round(ours / floor, 2) if ours and floor else None
    emit("each spec over seeds, as `tandem run` runs it (seconds from the first step to the success target)",
         rows, args.out, args=vars(args) | {"out": str(args.out)}, runs=runs_by_label)


if __name__ == "__main__":
    main()
