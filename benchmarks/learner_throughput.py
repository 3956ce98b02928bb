"""Learner throughput: tokens/s, MFU and memory per device of the GRPO train step.

Trains a named model shape (`learner.shapes.SHAPES`, its vocabulary included) or a
preset on full rows of random tokens (no padding) with the real `TrainStep`: the
GRPO loss, AdamW, the data/fsdp/tensor mesh. Each configuration is compiled ahead
of time, run once untimed, then timed over `--steps` steps. Every combination of
the models, `--dtype`, `--remat` and `--mesh` values is one configuration, and each
runs in a fresh Python process of its own, so its compile, memory and peak RSS are
its own. Usage:

    python benchmarks/learner_throughput.py --shape qwen2-25m qwen2-125m --rows 2 --length 1024 \\
        --remat none block --steps 2 --json /tmp/learner.json                          # CPU, one device
    XLA_FLAGS=--xla_force_host_platform_device_count=8 python benchmarks/learner_throughput.py \\
        --shape qwen2-125m --rows 8 --length 512 --mesh 1 8 1 --mesh 1 1 8 --steps 2   # 8 host devices
    python benchmarks/learner_throughput.py --preset 100m --dtype bfloat16 --steps 20    # GPU

On CPU, 8 host devices are one process: its memory is the sum of theirs (qwen2-125m,
8 x 512, tensor=8 peaked at 24.6 GB, this 23 GiB machine's limit). `--remat block`
saves almost no memory on CPU, for up to a fifth more FLOPs: see `learner.model`.

What each figure is:
  params      every parameter of the model (embedding included).
  tokens/s    rows x length x steps / the wall time of the timed steps; a step ends
              when its metrics are back on the host, so the time is the device's.
  ms/step     that wall time / steps.
  compile s   tracing, lowering and XLA compilation of the step (`lower().compile()`),
              not its first run.
  MFU         model FLOP/s / peak FLOP/s. Model FLOPs per token: 6 N for the forward
              and backward pass through the N parameters a token is multiplied by (all
              of them, less the input embedding when the output head is untied: a
              lookup), plus 12 x layers x d_model x L for attention scores and values
              over a row of L tokens, causal mask or not (PaLM, Chowdhery et al. 2022,
              appendix B). Remat's recomputation is not model FLOPs: it lowers MFU.
  XLA/model   the FLOPs XLA counts in the compiled step (`cost_analysis`, all devices)
              over the model FLOPs: above 1 by what is recomputed (remat) or redundant.
  peak        on CPU, measured in this run, before and after the configurations
              (MFU uses the higher): FLOP/s of a jitted `--matmul` square matmul, float32
              and bfloat16, on one device, the best of its runs over 3 s. That one
              device's matmul already uses every core, and XLA's host devices share
              the cores, so it is the peak of all of them together. On a GPU: the dense
              spec sheet figure x devices (`GPU_PEAK_TFLOPS`). `--peak-tflops` overrides both.
  memory      per device, from the compiled step (`memory_analysis()`): arguments
              (state and batch shards), outputs, the part of the outputs aliased to
              the donated arguments, temporaries (activations, gradients, collectives'
              buffers), generated code; live = arguments + outputs - aliased + temp.
              On a GPU, also the most its allocator held (`device_peak_bytes`).
  peak RSS    the configuration's process's peak resident memory (all its host
              devices, the compiler and the runtime included).
  CPU         CPU time of the configuration's process over the timed steps / (their
              wall time x cores): under 100% by the time the step left a core idle or
              another process took it (compare the load).
  load        the 1-minute load average when the configuration finished.
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import os
import resource
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import jax
import numpy as np

from learner.batching import make_batch
from learner.config import LearnerConfig, MeshConfig, ModelConfig
from learner.shapes import SHAPES
from learner.sharding import make_mesh
from learner.train import TrainStep, init_train_state
from learner.trajectory import Sample

PRESETS = {
    "tiny": dict(d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=256),
    # ~104M parameters: Llama-style 12 x 768 with grouped-query attention (4 KV heads).
    "100m": dict(d_model=768, n_layers=12, n_heads=12, n_kv_heads=4, d_ff=3072),
}
# Dense peak TFLOP/s of one GPU by dtype, from NVIDIA's spec sheets, keyed by a part of its
# `device_kind`: the first that matches (the PCIe and NVL parts before the SXM's "NVIDIA
# H100 80GB HBM3" and "NVIDIA H200"). float32 is the CUDA cores' figure, not TF32's.
GPU_PEAK_TFLOPS = (
    ("H100 PCIe", {"bfloat16": 756.0, "float32": 51.0}),
    ("H100 NVL", {"bfloat16": 835.0, "float32": 60.0}),
    ("H200 NVL", {"bfloat16": 835.0, "float32": 60.0}),
    ("H100", {"bfloat16": 989.0, "float32": 67.0}),
    ("H200", {"bfloat16": 989.0, "float32": 67.0}),
    ("A100", {"bfloat16": 312.0, "float32": 19.5}),
)
DTYPES = ("float32", "bfloat16")


def measured_matmul_tflops(dtype: str, n: int, seconds: float = 3.0) -> float:
    """TFLOP/s of a jitted n x n matmul on one device: the best of its runs over `seconds`
    (the best, not the mean: a peak, and other work on the machine only slows runs down)."""
    a = jax.random.normal(jax.random.key(0), (n, n), dtype)
    matmul = jax.jit(lambda x: x @ x)
    matmul(a).block_until_ready()  # compiles
    best, start = float("inf"), time.perf_counter()
    while time.perf_counter() - start < seconds:
        run = time.perf_counter()
        matmul(a).block_until_ready()
        best = min(best, time.perf_counter() - run)
    return 2 * n**3 / best / 1e12


def spec_peak_tflops(device_kind: str, dtype: str) -> float | None:
    """One GPU's dense peak TFLOP/s in `dtype` from `GPU_PEAK_TFLOPS`; None for a kind it lacks."""
    return next((peaks[dtype] for part, peaks in GPU_PEAK_TFLOPS if part in device_kind), None)


def machine(peak_override: float | None, matmul: int) -> dict[str, Any]:
    """The devices, and per dtype the peak TFLOP/s of all of them and where it comes from."""
    device, count = jax.devices()[0], jax.device_count()
    info = {"platform": device.platform, "device_kind": device.device_kind, "devices": count,
            "cpu_cores": os.cpu_count()}
    if peak_override:
        return {**info, "peaks": {d: (peak_override, "--peak-tflops") for d in DTYPES}}
    if device.platform == "gpu" and spec_peak_tflops(device.device_kind, "bfloat16"):
        return {**info, "peaks": {d: (spec_peak_tflops(device.device_kind, d) * count,
                                      f"{count} x {device.device_kind} dense {d} spec") for d in DTYPES}}
    if device.platform != "cpu":
        raise SystemExit(f"no known peak for {device.device_kind}; pass --peak-tflops")
    return {**info, "peaks": {d: (measured_matmul_tflops(d, matmul), f"measured: jitted {d} {matmul}^2 matmul, "
                                  "one device of this CPU") for d in DTYPES}}


def model_flops_per_token(model: ModelConfig, n_params: int, length: int) -> float:
    """6 N + 12 layers d_model L (see the module docstring); N leaves out an input
    embedding whose output head is untied (a lookup multiplies nothing)."""
    n_multiplied = n_params - (0 if model.tie_embeddings else model.vocab_size * model.d_model)
    return 6.0 * n_multiplied + 12.0 * model.n_layers * model.d_model * length


def full_rows(model: ModelConfig, rows: int, length: int, seed: int = 0):
    """A batch of `rows` rows, each one sample of `length` random tokens, all generated.

    How samples are packed into a row does not change the step's cost: attention is
    computed over the whole row and masked, whatever its segments.
    """
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


def model_config(name: str, dtype: str, length: int) -> ModelConfig:
    fields = SHAPES[name].model_fields() if name in SHAPES else PRESETS[name]
    return ModelConfig(**fields, dtype=dtype, max_len=length)


def measure(config: dict[str, Any]) -> dict[str, Any]:
    """Compiles, runs and times one configuration; its figures as a row (run in a fresh process)."""
    length, rows, steps = config["length"], config["rows"], config["steps"]
    model = model_config(config["model"], config["dtype"], length)
    learner = LearnerConfig(buckets=(length,), remat=config["remat"])
    mesh = make_mesh(MeshConfig(**dict(zip(("data", "fsdp", "tensor"), config["mesh"]))))
    state = init_train_state(model, learner, seed=0, mesh=mesh)
    n_params = sum(x.size for x in jax.tree.leaves(state.params))
    step, batch = TrainStep(model, learner, mesh), full_rows(model, rows, length)

    start = time.perf_counter()
    compiled = step.lower(state, batch).compile()  # the call below reuses this executable
    compile_s = time.perf_counter() - start
    memory = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost  # per-device program's count
    xla_flops = float(cost.get("flops", 0.0)) * jax.device_count() if cost else 0.0

    state, _ = step(state, batch)  # untimed: the first run of the executable
    cpu_start, start = cpu_seconds(), time.perf_counter()
    for _ in range(steps):
        state, metrics = step(state, batch)
    seconds = time.perf_counter() - start
    cpu_share = (cpu_seconds() - cpu_start) / (seconds * os.cpu_count())

    tokens = rows * length * steps
    flops_per_token = model_flops_per_token(model, n_params, length)
    row = {
        **config, "params": n_params, "mesh_shape": dict(mesh.shape), "devices": jax.device_count(),
        "device_kind": jax.devices()[0].device_kind, "tokens_per_s": tokens / seconds,
        "ms_per_step": seconds / steps * 1e3, "compile_s": compile_s, "cpu_share": cpu_share,
        "model_flops_per_token": flops_per_token,
        "xla_over_model_flops": xla_flops / (flops_per_token * rows * length) if xla_flops else None,
        "loss": metrics["loss"], "grad_norm": metrics["grad_norm"],
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "load_1min": os.getloadavg()[0], "device_peak_bytes": device_peak_bytes(),
    }
    if memory is not None:
        per_device = {
            "argument": memory.argument_size_in_bytes, "output": memory.output_size_in_bytes,
            "alias": memory.alias_size_in_bytes, "temp": memory.temp_size_in_bytes,
            "code": memory.generated_code_size_in_bytes,
        }
        per_device["live"] = per_device["argument"] + per_device["output"] - per_device["alias"] + per_device["temp"]
        row["memory_per_device_bytes"] = per_device
    return row


def device_peak_bytes() -> int | None:
    """The most bytes the first device's allocator has held in this process: what was
    really in use, where `memory_analysis` plans (None on CPU, which keeps no count)."""
    stats = jax.devices()[0].memory_stats()
    return stats.get("peak_bytes_in_use") if stats else None


def mfu(row: dict[str, Any], peak_tflops: float) -> float:
    """A measured row's model FLOP/s over `peak_tflops` (module docstring)."""
    return row["tokens_per_s"] * row["model_flops_per_token"] / (peak_tflops * 1e12)


def cpu_seconds() -> float:
    """User and system CPU time of this process, all its threads, so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def in_fresh_process(fn, *args) -> Any:
    """`fn(*args)` in a new Python process (spawned: it initialises JAX for itself, and
    this one never does, so no process holds a GPU while another needs it)."""
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(fn, *args).result()


def gb(n: float) -> str:
    return f"{n / 1e9:.2f}"


def describe(row: dict[str, Any]) -> str:
    name = f"{row['model']} {row['dtype']} remat={row['remat']} mesh (data, fsdp, tensor) {row['mesh']}"
    if "error" in row:
        return f"{name}: {row['error']}"
    m = row.get("memory_per_device_bytes")
    memory = "no memory analysis" if m is None else (
        f"memory per device (GB): arguments {gb(m['argument'])} outputs {gb(m['output'])} "
        f"(aliased {gb(m['alias'])}) temp {gb(m['temp'])} code {gb(m['code'])} -> live {gb(m['live'])}")
    xla = f"{row['xla_over_model_flops']:.2f}" if row["xla_over_model_flops"] else "n/a"
    return (f"{name}: {row['params'] / 1e6:.1f}M params, {row['rows']} x {row['length']} tokens, "
            f"{row['devices']} x {row['device_kind']}\n"
            f"  tokens/s {row['tokens_per_s']:,.0f}, {row['ms_per_step']:,.0f} ms/step, "
            f"compile {row['compile_s']:.1f} s, XLA/model FLOPs {xla}, loss {row['loss']:.4f}\n"
            f"  {memory}; peak RSS {gb(row['peak_rss_bytes'])} GB; CPU {row['cpu_share']:.0%}; "
            f"load {row['load_1min']:.2f}")


def table(results: list[dict[str, Any]]) -> str:
    lines = ["| model | dtype | remat | mesh d/f/t | rows x L | params | tokens/s | ms/step | compile s | MFU "
             "| XLA/model FLOPs | live GB/dev (arg, temp) | peak RSS GB | CPU | load |",
             "|" + "---|" * 15]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['dtype']} | {r['remat']} | {'/'.join(map(str, r['mesh']))} "
                         f"| {r['rows']} x {r['length']} | {r['error']} |" + " |" * 9)
            continue
        mesh = "/".join(str(r["mesh_shape"][axis]) for axis in ("data", "fsdp", "tensor"))
        m = r.get("memory_per_device_bytes")
        memory = f"{gb(m['live'])} ({gb(m['argument'])}, {gb(m['temp'])})" if m else "n/a"
        xla = f"{r['xla_over_model_flops']:.2f}" if r["xla_over_model_flops"] else "n/a"
        lines.append(f"| {r['model']} | {r['dtype']} | {r['remat']} | {mesh} | {r['rows']} x {r['length']} "
                     f"| {r['params'] / 1e6:.1f}M | {r['tokens_per_s']:,.0f} | {r['ms_per_step']:,.0f} "
                     f"| {r['compile_s']:.1f} | {r['mfu']:.1%} | {xla} | {memory} | {gb(r['peak_rss_bytes'])} "
                     f"| {r['cpu_share']:.0%} | {r['load_1min']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    models = parser.add_mutually_exclusive_group()
    models.add_argument("--shape", nargs="+", choices=sorted(SHAPES), help="named shapes (learner.shapes)")
    models.add_argument("--preset", nargs="+", choices=sorted(PRESETS), help="default: tiny")
    parser.add_argument("--dtype", nargs="+", choices=DTYPES, default=["float32"], help="compute dtype(s)")
    parser.add_argument("--remat", nargs="+", choices=["none", "block"], default=["none"])
    parser.add_argument("--mesh", type=int, nargs=3, action="append", metavar=("DATA", "FSDP", "TENSOR"),
                        help="repeatable; default -1 1 1 (data over all devices)")
    parser.add_argument("--steps", type=int, default=5, help="timed steps, after one untimed")
    parser.add_argument("--rows", type=int, default=None, help="rows per step; default: 32 on GPU, 4 on CPU")
    parser.add_argument("--length", type=int, default=None, help="tokens per row; default: 2048 GPU, 128 CPU")
    parser.add_argument("--matmul", type=int, default=2048, help="side of the square matmul that measures a CPU's peak")
    parser.add_argument("--peak-tflops", type=float, default=None, help="peak FLOP/s of all devices, in TFLOP/s")
    parser.add_argument("--json", default=None, metavar="PATH", help="also write the peaks and the rows here")
    args = parser.parse_args()

    host = in_fresh_process(machine, args.peak_tflops, args.matmul)
    on_cpu = host["platform"] == "cpu"
    rows, length = args.rows or (4 if on_cpu else 32), args.length or (128 if on_cpu else 2048)
    print(f"{host['devices']} x {host['device_kind']}, {host['cpu_cores']} CPU cores; load {os.getloadavg()}")
    print_peaks("before", host["peaks"])

    names = args.shape or args.preset or ["tiny"]
    configurations = [
        {"model": name, "dtype": dtype, "remat": remat, "mesh": tuple(mesh), "rows": rows, "length": length,
         "steps": args.steps}
        for name, dtype, remat, mesh in itertools.product(names, args.dtype, args.remat, args.mesh or [(-1, 1, 1)])
    ]
    results = []
    for config in configurations:
        try:
            row = in_fresh_process(measure, config)
        except BrokenProcessPool as error:  # the process was killed, most likely for memory
            row = {**config, "error": f"the process died: {error}"}
        except Exception as error:  # noqa: BLE001: one configuration failing is a result; go on
            row = {**config, "error": f"{type(error).__name__}: {str(error).splitlines()[0]}"}
        results.append(row)
        print(describe(row), flush=True)

    # A measured peak is measured again after the configurations; MFU is against the
    # higher of the two, the most the machine showed it can do in this run.
    peaks = host["peaks"]
    if on_cpu and not args.peak_tflops:
        after = in_fresh_process(machine, None, args.matmul)["peaks"]
        print_peaks("after", after)
        peaks = {d: max(peaks[d], after[d]) for d in DTYPES}
        host = {**host, "peaks_after": after}
    for row in results:
        if "error" not in row:
            row["peak_tflops"], row["peak_source"] = peaks[row["dtype"]]
            row["mfu"] = mfu(row, row["peak_tflops"])
    print()
    print(table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**host, "rows": results}, f, indent=1)


def print_peaks(when: str, peaks: dict[str, tuple[float, str]]) -> None:
    for dtype, (tflops, source) in peaks.items():
        print(f"peak {dtype} ({when}): {tflops:.3f} TFLOP/s ({source})")


if __name__ == "__main__":
    main()
