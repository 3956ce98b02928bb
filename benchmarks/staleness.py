"""Exit-time exclusion against admission control, on a slow environment (issue 3).

Runs the same spec twice through `tandem run` — `buffer.max_staleness: 1` alone, then with
`buffer.admission: true` — and prints, side by side, stale exclusions, retries, the
learner's busy %, trained groups/s and the accounting check. Usage:

    python benchmarks/staleness.py [--steps 30] [--latency 0.2] [--out benchmarks/results/staleness.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

from harness import ROOT, TANDEM, emit  # benchmarks are scripts that import their siblings
from tasks.buffer.ledger import balanced


def slow_env_overrides(steps: int, latency_s: float) -> list[str]:
    """A slow environment, a fast-publishing learner and a deep buffer: groups go stale."""
    sets = [f"learner.steps={steps}", "learner.batch_groups=2", "sync.interval=1", "buffer.capacity=16",
            "buffer.max_staleness=1", "actors.workers=2", "actors.actors=4", f"env.latency_s={latency_s}",
            "checkpoint.every=1000", "buffer.max_retries=10"]
    return [arg for s in sets for arg in ("--set", s)]


def run(run_dir: Path, overrides: list[str]) -> dict:
    """One `tandem run`; its accounting and the learner's figures from metrics.jsonl."""
    result = subprocess.run([TANDEM, "run", "specs/guess-number.yaml", *overrides,
                             "--set", f"checkpoint.dir={run_dir}"], cwd=ROOT, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(result.stdout[-2000:] + result.stderr[-2000:])
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    accounting = json.loads((run_dir / "accounting.json").read_text())
    wall = metrics[-1]["time"] - metrics[0]["time"]
    train = sum(m["train_s"] for m in metrics[1:])
    return {"stale": accounting["excluded"].get("stale", 0), "retried": accounting["retried"],
            "staleness_max": max(m["staleness_max"] for m in metrics),
            "learner_busy_%": 100 * train / wall if wall else None,
            "groups_per_s": (len(metrics) - 1) * 2 / wall if wall else None,
            "balanced": balanced(accounting), "accounting": accounting}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "staleness.json")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, extra in (("exit check only", []), ("admission control", ["--set", "buffer.admission=true"])):
            figures = run(Path(tmp) / name.replace(" ", "-"), slow_env_overrides(args.steps, args.latency) + extra)
            rows.append({"mode": name, **{k: v for k, v in figures.items() if k != "accounting"}})
    emit(f"max_staleness 1, env latency {args.latency}s/step", rows, args.out)


if __name__ == "__main__":
    main()
