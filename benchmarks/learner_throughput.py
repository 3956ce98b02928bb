"""Learner throughput: tokens per second and model FLOP utilisation of the train step.

Trains a preset model on full rows of random tokens (no padding) for `--steps`
steps after one compiling step, then prints tokens/s and MFU = achieved model
FLOP/s / peak FLOP/s. Model FLOPs per token are 6 N (forward and backward
through N parameters, embedding included as the tied output head) plus
12 * layers * d_model * L for attention scores and values over a row of L tokens
(PaLM, Chowdhery et al. 2022, appendix B), whatever the mesh or kernel does.
Usage:

    python benchmarks/learner_throughput.py --preset 100m --dtype bfloat16 --steps 20   # GPU
    python benchmarks/learner_throughput.py --preset tiny --steps 5                       # CPU
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np

from learner.batching import make_batch
from learner.config import LearnerConfig, MeshConfig, ModelConfig
from learner.sharding import make_mesh
from learner.train import TrainStep, init_train_state
from learner.trajectory import Sample

PRESETS = {
    "tiny": dict(d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=256),
    # ~104M parameters: Llama-style 12 x 768 with grouped-query attention (4 KV heads).
    "100m": dict(d_model=768, n_layers=12, n_heads=12, n_kv_heads=4, d_ff=3072),
}
# Dense peak FLOP/s by device kind and dtype. A CPU has no published figure that fits
# every machine: its peak is measured as the FLOP/s of a large jitted matmul.
PEAK_TFLOPS = {("gpu", "bfloat16"): 989.0, ("gpu", "float32"): 67.0}


def measured_matmul_tflops(dtype: str, n: int = 2048, repeats: int = 10) -> float:
    """FLOP/s of a jitted n x n matmul: what the machine's dense kernels reach, in TFLOP/s."""
    a = jax.numpy.ones((n, n), dtype)
    matmul = jax.jit(lambda x: x @ x)
    matmul(a).block_until_ready()
    start = time.perf_counter()
    for _ in range(repeats):
        matmul(a).block_until_ready()
    return 2 * n**3 * repeats / (time.perf_counter() - start) / 1e12


def peak_tflops(dtype: str) -> tuple[float, str]:
    device = jax.devices()[0]
    if device.platform == "gpu" and ("H100" in device.device_kind or "H200" in device.device_kind):
        return PEAK_TFLOPS[("gpu", dtype)] * jax.device_count(), f"{device.device_kind} dense {dtype} spec"
    if device.platform == "cpu":
        return measured_matmul_tflops(dtype), f"measured {dtype} 2048x2048 matmul on this CPU"
    raise SystemExit(f"no known peak for {device.device_kind}; pass --peak-tflops")


def model_flops_per_token(model: ModelConfig, n_params: int, length: int) -> float:
    return 6.0 * n_params + 12.0 * model.n_layers * model.d_model * length


def full_rows(model: ModelConfig, rows: int, length: int, seed: int = 0):
    """A batch of `rows` rows, each one sample of `length` random tokens, all generated."""
    rng = np.random.default_rng(seed)
    samples = [
        Sample(
            np.concatenate([[1], rng.integers(3, model.vocab_size, length - 1)]).astype(np.int32),
            np.full(length, -4.6, np.float32),
            np.where(np.arange(length) == 0, -1, 0).astype(np.int32),
            reward=0.0,
        )
        for _ in range(rows)
    ]
    return make_batch(samples, rng.normal(size=rows).tolist(), (length,), rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rows", type=int, default=None, help="default: 32 on GPU, 4 on CPU")
    parser.add_argument("--length", type=int, default=None, help="tokens per row; default: 2048 GPU, 128 CPU")
    parser.add_argument("--mesh", type=int, nargs=3, default=(-1, 1, 1), metavar=("DATA", "FSDP", "TENSOR"))
    parser.add_argument("--peak-tflops", type=float, default=None, help="peak FLOP/s of all devices, in TFLOP/s")
    args = parser.parse_args()
    on_cpu = jax.devices()[0].platform == "cpu"
    rows = args.rows or (4 if on_cpu else 32)
    length = args.length or (128 if on_cpu else 2048)
    model = ModelConfig(**PRESETS[args.preset], dtype=args.dtype, max_len=length)
    learner = LearnerConfig(buckets=(length,))
    mesh = make_mesh(MeshConfig(data=args.mesh[0], fsdp=args.mesh[1], tensor=args.mesh[2]))
    state = init_train_state(model, learner, seed=0, mesh=mesh)
    n_params = sum(x.size for x in jax.tree.leaves(state.params))
    step, batch = TrainStep(model, learner, mesh), full_rows(model, rows, length)
    start = time.perf_counter()
    state, _ = step(state, batch)  # compiles; metrics come back as floats, so it has finished
    compile_s = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(args.steps):
        state, metrics = step(state, batch)
    seconds = time.perf_counter() - start
    tokens_per_s = rows * length * args.steps / seconds
    peak, source = (args.peak_tflops, "--peak-tflops") if args.peak_tflops else peak_tflops(args.dtype)
    mfu = tokens_per_s * model_flops_per_token(model, n_params, length) / (peak * 1e12)
    print(f"{args.preset}: {n_params / 1e6:.1f}M params, {args.dtype}, mesh {dict(mesh.shape)}, "
          f"{jax.device_count()} x {jax.devices()[0].device_kind}, batch {rows} x {length}")
    print(f"first step (compile) {compile_s:.1f} s; {args.steps} steps {seconds:.2f} s "
          f"({seconds / args.steps * 1e3:.0f} ms/step), loss {metrics['loss']:.4f}")
    print(f"tokens/s {tokens_per_s:,.0f}; MFU {mfu:.1%} of {peak:g} TFLOP/s ({source})")


if __name__ == "__main__":
    main()
