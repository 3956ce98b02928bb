"""Generation at LLM shapes: Tandem's engine beside `transformers`' `generate` and Tunix's
sampler, on the same Hugging Face directories (`tandem new-model`), with the machine's limits.

Each system runs in a process of its own (`benchmarks/beside/*_side.py`: Tunix's in its own
environment, `make tunix-venv`), the systems in turns within each of `--rounds` rounds, so that
drift on a shared machine falls on all alike; figures are medians over the rounds. Per model
and slots count: prefill and decode tokens/s at `--context` tokens, peak RSS, and Tandem's
decode against the faster other. The limits are measured in this process first: memory
bandwidth (a NumPy copy of 1 GiB, bytes read plus written) and f32 matmul FLOP/s (a jitted
4096^2 product). Batch-1 decode reads every weight and the cached keys and values once per
token, so its share of the bandwidth limit is tokens/s x (weight bytes + context x KV bytes
a position) / bandwidth. Usage:

    python benchmarks/llm_shapes.py --models models/qwen2-25m models/qwen2-125m --slots 1 8
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from harness import ROOT, emit
from learner.config import ModelConfig

SIDES = {"tandem": (sys.executable, "benchmarks/beside/tandem_side.py"),
         "transformers": (sys.executable, "benchmarks/beside/transformers_side.py"),
         "tunix": (str(ROOT / ".venv-tunix" / "bin" / "python"), "benchmarks/beside/tunix_side.py")}


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
    python, script = SIDES[system]
    if not Path(python).exists():
        return {"system": system, "error": f"{python} missing (make tunix-venv)"}
    done = subprocess.run([python, script, "--part", "decode", "--model", str(model), "--slots", str(slots),
                           "--context", str(context),
                           "--new-tokens", str(new_tokens), "--repeats", str(repeats)],
                          cwd=ROOT, capture_output=True, text=True, timeout=1_800)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        return {"system": system, "error": (done.stderr or done.stdout).strip().splitlines()[-1:]}
    return json.loads(lines[-1])


def weight_and_kv_bytes(model: Path) -> tuple[int, int]:
    """Bytes of the weights (float32) and of one cached position's keys and values."""
    weights = sum(f.stat().st_size for f in model.glob("*.safetensors"))
    return weights, ModelConfig(init=str(model)).kv_bytes_per_position


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=Path, nargs="+", required=True)
    parser.add_argument("--systems", nargs="+", choices=sorted(SIDES), default=["tandem", "transformers", "tunix"])
    parser.add_argument("--slots", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3, help="timed pairs in each system's run")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("results") / "llm_shapes.json")
    args = parser.parse_args()
    limit = limits()
    print(f"limits here: memory bandwidth {limit['bandwidth_gb_s']:.1f} GB/s, f32 matmul "
          f"{limit['matmul_gflop_s']:.0f} GFLOP/s; load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
    runs: dict[tuple, list[dict]] = {}
    for round_ in range(args.rounds):
        for model in args.models:
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
        weights, kv = weight_and_kv_bytes(next(m for m in args.models if m.name == name))
        moved = row["decode_tokens_per_s"] / slots * (weights + slots * args.context * kv)
        row["bandwidth_share"] = moved / 1e9 / limit["bandwidth_gb_s"]
        rows.append(row)
    for row in rows:
        others = [r.get("decode_tokens_per_s", 0) for r in rows
                  if (r["model"], r["slots"]) == (row["model"], row["slots"]) and r["system"] != "tandem"]
        if row["system"] == "tandem" and any(others):
            row["tandem_x_faster_other"] = row["decode_tokens_per_s"] / max(others)
    emit(f"generation at {args.context}-token contexts, {args.new_tokens} new tokens, medians of {args.rounds} rounds",
         rows, args.out, limits=limit)


if __name__ == "__main__":
    main()
