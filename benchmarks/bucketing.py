"""Fixed shapes over a run: compilations and padding, with and without packing.

Draws `--steps` batches of GRPO-sized sample sets with random episode lengths,
packs them with `make_batch` and trains a tiny model on each with `TrainStep`,
then prints the number of train-step compilations against the number of bucket
lengths used and the mean padding fraction, for packed rows (`learner.rows`) and
for one row per sample (the default). Usage:

    python benchmarks/bucketing.py [--steps 200] [--rows 8] [--no-train]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from learner.batching import make_batch
from learner.config import LearnerConfig, MeshConfig, ModelConfig
from learner.trajectory import Sample

MODEL = ModelConfig(d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, d_ff=64)
# Spaced ~12% apart above the longest episode: a packed batch wastes at most about that.
BUCKETS = (128, 160, 192, 224, 256, 288, 320, 352, 384, 448, 512)


def random_samples(rng: np.random.Generator, n: int, shortest: int, longest: int) -> list[Sample]:
    """`n` episodes of uniformly random length: a 4-token prompt, then generated tokens."""
    samples = []
    for length in rng.integers(shortest, longest + 1, size=n):
        tokens = np.concatenate([[1], rng.integers(3, MODEL.vocab_size, length - 1)]).astype(np.int32)
        versions = np.where(np.arange(length) < 4, -1, 0).astype(np.int32)
        logprobs = np.where(versions >= 0, -4.6, 0.0).astype(np.float32)
        samples.append(Sample(tokens, logprobs, versions, reward=0.0))
    return samples


def run(batches, learner: LearnerConfig, train: bool) -> dict:
    """Packs every batch of samples; trains on each if `train`."""
    shapes, padding = [], []
    if train:
        import jax

        from learner.sharding import make_mesh
        from learner.train import TrainStep, init_train_state

        mesh = make_mesh(MeshConfig(), devices=jax.devices()[:1])
        state, step = init_train_state(MODEL, learner, seed=0, mesh=mesh), TrainStep(MODEL, learner, mesh)
    start = time.perf_counter()
    for samples in batches:
        batch = make_batch(samples, [1.0] * len(samples), learner.buckets, learner.batch_rows(len(samples)))
        shapes.append(batch.shape)
        padding.append(batch.padding)
        if train:
            state, _ = step(state, batch)
    return {
        "buckets used": len({length for _, length in shapes}),
        "compiles": step.compiles if train else None,
        "padding": float(np.mean(padding)),
        "rows x length": sorted(set(shapes)),
        "seconds": time.perf_counter() - start,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--samples", type=int, default=32, help="samples per batch (groups x group size)")
    parser.add_argument("--rows", type=int, default=8, help="rows of a packed batch (learner.rows)")
    parser.add_argument("--lengths", type=int, nargs=2, default=(8, 128), help="shortest and longest episode")
    parser.add_argument("--no-train", action="store_true", help="only pack; count no compilations")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    batches = [random_samples(rng, args.samples, *args.lengths) for _ in range(args.steps)]
    print(f"{args.steps} batches of {args.samples} episodes of {args.lengths[0]}..{args.lengths[1]} tokens, "
          f"buckets {BUCKETS}")
    for name, rows in (("packed", args.rows), ("one row per sample", None)):
        result = run(batches, LearnerConfig(buckets=BUCKETS, rows=rows), train=not args.no_train)
        print(f"{name:>20}: " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                                          for k, v in result.items()))


if __name__ == "__main__":
    main()
