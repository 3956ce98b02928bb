"""(k) Today's tree against an earlier commit, side by side: each one's `tandem run` of its own
`specs/guess-number.yaml` (no success stop), alternated so that neither always runs first,
timed from its first step to the first record whose mean success over 20 steps reaches
`--target`. The earlier commit is checked out as a `git worktree` and run with this
checkout's `.venv` (its code first on the path), so the two differ in code only. Usage:

    python benchmarks/versus.py [--commit 9ef8a8e] [--runs 3] [--target 0.9] [--seconds 400]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from harness import ROOT, emit, reached, run_tandem

SPEC = "specs/guess-number.yaml"
WINDOW = 20  # as benchmarks/single_process.py and decoupling_cost.py
BASELINE = "9ef8a8e"  # issue 14's baseline: before the batched actor engine


def one_run(tree: Path, label: str, target: float, budget_s: float, run_dir: Path) -> dict:
    result = run_tandem(SPEC, ["learner.stop_at_success=null"], run_dir, cores=None, budget_s=budget_s,
                        stop=lambda records: reached(records, target, WINDOW) is not None, tree=tree)
    records = result.records
    hit = reached(records, target, WINDOW)
    return {"tree": label, "to_target_s": hit["time"] - records[0]["time"] if hit else None,
            "steps": hit["step"] if hit else None, "from_launch_s": hit["time"] - result.launched if hit else None,
            "load": round(os.getloadavg()[0], 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--commit", default=BASELINE, help="the earlier tree")
    parser.add_argument("--runs", type=int, default=3, help="runs of each tree, alternated")
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--seconds", type=float, default=400.0, help="budget of each run after its first step")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "versus.json")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="tandem-versus-") as tmp:
        earlier = Path(tmp) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", str(earlier), args.commit], cwd=ROOT, check=True,
                       capture_output=True)
        try:
            trees = [(ROOT, "HEAD"), (earlier, args.commit)]
            for i in range(args.runs):
                for tree, label in (trees if i % 2 == 0 else trees[::-1]):
                    rows.append(one_run(tree, label, args.target, args.seconds, Path(tmp) / f"{label}-{i}"))
                    print(rows[-1], flush=True)
                    time.sleep(2)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(earlier)], check=False, cwd=ROOT,
                           capture_output=True)
    for label in ("HEAD", args.commit):
        times = [r["to_target_s"] for r in rows if r["tree"] == label and r["to_target_s"] is not None]
        missed = sum(1 for r in rows if r["tree"] == label and r["to_target_s"] is None)
        rows.append({"tree": f"{label}: median (min-max)", "missed": missed,
                     "to_target_s": f"{statistics.median(times):.1f} ({min(times):.1f}-{max(times):.1f})" if times
                     else None})
    emit(f"{SPEC} to {args.target:.0%} (20-step mean), seconds from the first step: HEAD against {args.commit}",
         rows, args.out)


if __name__ == "__main__":
    main()
