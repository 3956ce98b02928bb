"""(c) Train-step compilations and padding over many steps of random episode lengths,
with bucketing and packing on and off.

Reuses benchmarks/bucketing.py (its random episodes, tiny model and buckets) and adds
the case with both off: every batch padded to its own longest episode (a bucket per
length), so XLA compiles once per distinct batch length. Usage:

    python benchmarks/recompiles.py [--quick] [--steps 1000] [--out PATH]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from bucketing import BUCKETS, random_samples, run
from harness import emit

from learner.config import LearnerConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="100 steps")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--samples", type=int, default=32, help="episodes per batch (groups x group size)")
    parser.add_argument("--rows", type=int, default=8, help="rows of a packed batch")
    parser.add_argument("--lengths", type=int, nargs=2, default=(8, 128), help="shortest and longest episode")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("results") / "recompiles.json")
    args = parser.parse_args()
    if args.quick:
        args.steps = 100
    rng = np.random.default_rng(args.seed)
    batches = [random_samples(rng, args.samples, *args.lengths) for _ in range(args.steps)]
    every_length = tuple(range(1, max(args.lengths[1], BUCKETS[-1]) + 1))
    cases = {"off (pad to the batch's longest)": LearnerConfig(buckets=every_length),
             "buckets": LearnerConfig(buckets=BUCKETS),
             "buckets + packing": LearnerConfig(buckets=BUCKETS, rows=args.rows)}
    rows = []
    for name, learner in cases.items():
        result = run(batches, learner, train=True)
        rows.append({"case": name, "compiles": result["compiles"], "shapes": len(result["rows x length"]),
                     "padding": result["padding"], "seconds": result["seconds"],
                     "ms/step": 1e3 * result["seconds"] / args.steps})
        print(rows[-1], flush=True)
    emit(f"recompiles and padding: {args.steps} steps of {args.samples} episodes of "
         f"{args.lengths[0]}..{args.lengths[1]} tokens", rows, args.out, args=vars(args) | {"out": str(args.out)})


if __name__ == "__main__":
    main()
