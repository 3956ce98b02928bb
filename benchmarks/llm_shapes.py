"""Generation at LLM shapes: Tandem's engine beside `transformers`' `generate` and Tunix's
sampler, on the same Hugging Face directories (`tandem new-model`), with the machine's limits.

Each system runs in a process of its own (`benchmarks/beside/*_side.py`: Tunix's in its own
environment, `make tunix-venv`), the systems in turns within each of `--rounds` rounds, so that
drift on a shared machine falls on all alike; figures are medians over the rounds. Per model
and slots count: prefill and decode tokens/s at `--context` tokens, peak RSS, and Tandem's
decode against the faster other. With `--learner-rows`, the learner too: a GRPO train step on
the same rows (`--learner-rows` x `--learner-length` tokens), Tandem's (`learner_throughput.py
--shape`, MFU against its measured matmul peak) beside Tunix's, alternated in the same rounds.
The limits are measured in this process first: memory
bandwidth (a NumPy copy of 1 GiB, bytes read plus written) and f32 matmul FLOP/s (a jitted
4096^2 product). Batch-1 decode reads every weight and the cached keys and values once per
token, so its share of the bandwidth limit is tokens/s x (weight bytes + context x KV bytes
a position) / bandwidth. Usage:

    python benchmarks/llm_shapes.py --models models/qwen2-25m models/qwen2-125m --slots 1 8
    python benchmarks/llm_shapes.py --models models/qwen2-125m --slots --learner-rows 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from harness import ROOT, emit
from learner.config import ModelConfig

# (python, script, extra arguments); `tandem-kv-bf16` is Tandem's engine with a bfloat16 KV
# cache under the same float32 weights (`actors.kv_cache_dtype`): Tunix's cache follows its model's dtype.
SIDES = {"tandem": (sys.executable, "benchmarks/beside/tandem_side.py", []),
         "tandem-kv-bf16": (sys.executable, "benchmarks/beside/tandem_side.py", ["--kv-cache-dtype", "bfloat16"]),
         "transformers": (sys.executable, "benchmarks/beside/transformers_side.py", []),
         "tunix": (str(ROOT / ".venv-tunix" / "bin" / "python"), "benchmarks/beside/tunix_side.py", [])}


def limits() -> dict:
    """Memory bandwidth (GB/s, read + write) and f32 matmul FLOP/s measured here."""
    a, b = np.ones(2 ** 28, np.float32), np.empty(2 ** 28, np.float32)
    np.copyto(b, a)
    copies = []
    for _ in range(5):
        started = time.perf_counter()
        np.copyto(b, a)
        copies.append(time.perf_counter() - started)
    x = jnp.ones((4096, 4096), jnp.float32)
    product = jax.jit(lambda x: x @ x)
    product(x).block_until_ready()
    started = time.perf_counter()
    for _ in range(5):
        product(x).block_until_ready()
    matmul_s = (time.perf_counter() - started) / 5
    return {"bandwidth_gb_s": 2 * a.nbytes / min(copies) / 1e9, "matmul_gflop_s": 2 * 4096 ** 3 / matmul_s / 1e9}


def side(system: str, model: Path, slots: int, context: int, new_tokens: int, repeats: int) -> dict:
    python, script, extra = SIDES[system]
    if not Path(python).exists():
        return {"system": system, "error": f"{python} missing (make tunix-venv)"}
    done = subprocess.run([python, script, *extra, "--part", "decode", "--model", str(model), "--slots", str(slots),
                           "--context", str(context),
                           "--new-tokens", str(new_tokens), "--repeats", str(repeats)],
                          cwd=ROOT, capture_output=True, text=True, timeout=1_800)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        return {"system": system, "error": (done.stderr or done.stdout).strip().splitlines()[-1:]}
    return json.loads(lines[-1])


def learner_side(system: str, model: Path, rows: int, length: int, steps: int) -> dict:
    """One GRPO train step's tokens/s on `rows` x `length` tokens, in a process of its own."""
    if system == "tunix":
        python, script, _ = SIDES["tunix"]
        if not Path(python).exists():
            return {"error": f"{python} missing (make tunix-venv)"}
        command = [python, script, "--part", "learner", "--model", str(model)]
    else:  # Tandem's learner on the model's shape (learner.shapes), random weights alike
        command = [sys.executable, "benchmarks/learner_throughput.py", "--shape", model.name]
    with tempfile.TemporaryDirectory() as tmp:
        if system == "tandem":
            command += ["--json", f"{tmp}/out.json"]
        done = subprocess.run(command + ["--rows", str(rows), "--length", str(length), "--steps", str(steps)],
                              cwd=ROOT, capture_output=True, text=True, timeout=3_600)
        if done.returncode:
            return {"error": (done.stderr or done.stdout).strip().splitlines()[-1:]}
        if system == "tandem":
            row = json.loads(Path(f"{tmp}/out.json").read_text())["rows"][0]
            if "error" in row:
                return {"error": row["error"]}
            return {"tokens_per_s": row["tokens_per_s"], "mfu": row["mfu"],
                    "peak_rss_gb": row["peak_rss_bytes"] / 1e9}
    result = json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])
    return {"tokens_per_s": result["tokens_per_s"], "peak_rss_gb": result["peak_rss_gb"]}


def learner_rows(runs: dict[tuple, list[dict]]) -> list[dict]:
    rows = []
    for (name, system), results in runs.items():
        good = [r for r in results if "error" not in r]
        row = {"model": name, "system": system, "runs": len(good)}
        if not good:
            rows.append(row | {"error": results[-1].get("error")})
            continue
        for key in ("tokens_per_s", "mfu", "peak_rss_gb"):
            if key in good[0]:
                row[key] = statistics.median(r[key] for r in good)
        rows.append(row)
    for row in rows:
        tunix = [r.get("tokens_per_s") for r in rows if (r["model"], r["system"]) == (row["model"], "tunix")]
        if row["system"] == "tandem" and row.get("tokens_per_s") and tunix and tunix[0]:
            row["tandem_x_tunix"] = row["tokens_per_s"] / tunix[0]
    return rows


def weight_and_kv_bytes(model: Path, cache_dtype: str | None = None) -> tuple[int, int]:
    """Bytes of the weights (float32) and of one cached position's keys and values (in
    `cache_dtype`, as the run reports it; None: the model's dtype)."""
    weights = sum(f.stat().st_size for f in model.glob("*.safetensors"))
    return weights, ModelConfig(init=str(model)).kv_bytes_per_position(cache_dtype)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=Path, nargs="+", required=True)
    parser.add_argument("--systems", nargs="+", choices=sorted(SIDES), default=["tandem", "transformers", "tunix"])
    parser.add_argument("--slots", type=int, nargs="*", default=[1, 8], help="none: no generation")
    parser.add_argument("--context", type=int, default=1024)
    # Decode is the difference of a 1-token and a full call, each led by the same prefill
    # (`decode_timing`): at 64 new tokens an 8-slot prefill (~12 s) outweighed the decoding
    # (~5 s), and its drift moved Tandem's decode by up to 40% between rounds (BENCHMARKS (t'), (u)).
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3, help="timed pairs in each system's run")
    parser.add_argument("--learner-rows", type=int, default=0, help="0: no learner comparison")
    parser.add_argument("--learner-length", type=int, default=1024)
    parser.add_argument("--learner-steps", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("results") / "llm_shapes.json")
    args = parser.parse_args()
    limit = limits()
    print(f"limits here: memory bandwidth {limit['bandwidth_gb_s']:.1f} GB/s, f32 matmul "
          f"{limit['matmul_gflop_s']:.0f} GFLOP/s; load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
    runs: dict[tuple, list[dict]] = {}
    learner_runs: dict[tuple, list[dict]] = {}
    learner_systems = [s for s in ("tandem", "tunix") if s in args.systems]
    for round_ in range(args.rounds):
        for model in args.models:
            for system in learner_systems if args.learner_rows else []:
                result = learner_side(system, model, args.learner_rows, args.learner_length, args.learner_steps)
                learner_runs.setdefault((model.name, system), []).append(result)
                print(f"round {round_}: {model.name} learner {system}: "
                      f"{result.get('tokens_per_s', result.get('error'))}", flush=True)
            for slots in args.slots:
                for system in args.systems:
                    result = side(system, model, slots, args.context, args.new_tokens, args.repeats)
                    runs.setdefault((model.name, slots, system), []).append(result)
                    print(f"round {round_}: {model.name} slots {slots} {system}: "
                          f"{result.get('decode_tokens_per_s', result.get('error'))}", flush=True)
    rows = []
    for (name, slots, system), results in runs.items():
        good = [r for r in results if "error" not in r and r.get("decode_tokens_per_s")]
        row = {"model": name, "slots": slots, "system": system, "runs": len(good)}
        if not good:
            rows.append(row | {"error": results[-1].get("error")})
            continue
        for key in ("prefill_tokens_per_s", "decode_tokens_per_s", "peak_rss_gb"):
            row[key] = statistics.median(r[key] for r in good)
        weights, kv = weight_and_kv_bytes(next(m for m in args.models if m.name == name), good[0].get("kv_cache_dtype"))
        moved = row["decode_tokens_per_s"] / slots * (weights + slots * args.context * kv)
        row["bandwidth_share"] = moved / 1e9 / limit["bandwidth_gb_s"]
        rows.append(row)
    for row in rows:
        others = [r.get("decode_tokens_per_s", 0) for r in rows
                  if (r["model"], r["slots"]) == (row["model"], row["slots"]) and not r["system"].startswith("tandem")]
        if row["system"].startswith("tandem") and any(others):
            row["tandem_x_faster_other"] = row["decode_tokens_per_s"] / max(others)
    if learner_runs:
        emit(f"GRPO train step on {args.learner_rows} x {args.learner_length} tokens, float32, "
             f"medians of {args.rounds} rounds", learner_rows(learner_runs),
             args.out.with_name(args.out.stem + "_learner.json"), limits=limit)
    if not rows:
        return
    emit(f"generation at {args.context}-token contexts, {args.new_tokens} new tokens, medians of {args.rounds} rounds",
         rows, args.out, limits=limit)


if __name__ == "__main__":
    main()
