"""(e) The cost of decoupling: time to a success rate at zero env latency, `tandem run` of
the default spec against benchmarks/single_process.py (same model, same GRPO batch,
sampling and training in one process, no Dask or Prefect), and Tandem's start-up alone.

Both run as they ship, unpinned, from launch to the first record whose mean success over
20 steps reaches `--target`; "training s" counts from the first step. Start-up is split
at the lines `tandem run` prints: the Prefect API answering, the flow run beginning, the
first Dask worker registering, and the first learner step recorded (its `train_s` is the
learner's first compile). Usage:

    python benchmarks/decoupling_cost.py [--quick] [--target 0.9] [--seconds 600] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import ROOT, emit, reached, run_tandem

SPEC = "specs/guess-number.yaml"
WINDOW = 20  # steps the success rate is averaged over, as benchmarks/single_process.py does
MARKS = {"api": "Prefect UI:", "flow": "Beginning flow run", "cluster": "Register worker"}


def floor(target: float, budget_s: float) -> dict:
    launched = time.time()
    try:
        done = subprocess.run([sys.executable, "benchmarks/single_process.py", SPEC, "--target", str(target)],
                              cwd=ROOT, capture_output=True, text=True, timeout=budget_s)
    except subprocess.TimeoutExpired:
        return {"run": "single process (floor)", "to_target_s": None, "training_s": None, "steps": None}
    wall = time.time() - launched
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return {"run": "single process (floor)", "to_target_s": wall if result["seconds"] else None,
            "training_s": result["seconds"], "steps": result["step"]}


def tandem(target: float, budget_s: float, work: Path) -> tuple[dict, dict]:
    result = run_tandem(SPEC, [], work / "tandem", cores=None, budget_s=budget_s,
                        stop=lambda records: reached(records, target, WINDOW) is not None, markers=tuple(MARKS.values()))
    records, t0 = result.records, result.launched
    hit = reached(records, target, WINDOW)
    first = records[0] if records else None
    row = {"run": "tandem run", "to_target_s": hit["time"] - t0 if hit else None,
           "training_s": hit["time"] - first["time"] if hit else None, "steps": hit["step"] if hit else None}
    at = {name: result.marks[m] - t0 for name, m in MARKS.items() if m in result.marks}
    startup = {"prefect_api_s": at.get("api"), "flow_begins_s": at.get("flow"),
               "dask_worker_s": at.get("cluster"), "first_step_s": first["time"] - t0 if first else None,
               "learner_first_compile_s": first["train_s"] if first else None}
    return row, startup


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="target 0.5, 180 s budget")
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--seconds", type=float, default=600.0, help="budget of each run (after its first step for tandem)")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("results") / "decoupling_cost.json")
    args = parser.parse_args()
    if args.quick:
        args.target, args.seconds = 0.5, 180.0
    with tempfile.TemporaryDirectory(prefix="tandem-bench-") as work:
        row, startup = tandem(args.target, args.seconds, Path(work))
    rows = [floor(args.target, args.seconds), row]
    if rows[0]["to_target_s"] and row["to_target_s"]:
        row["x floor"] = row["to_target_s"] / rows[0]["to_target_s"]
    emit(f"cost of decoupling: {SPEC} to {args.target:.0%} success (seconds from launch)", rows, args.out,
         startup=startup, args=vars(args) | {"out": str(args.out)})
    emit("tandem run start-up (seconds from launch)", [startup], args.out.with_name("startup.json"))


if __name__ == "__main__":
    main()
