"""One accelerator's figures at LLM shapes, in bfloat16, within a time budget: the learner's
GRPO train step and the engine's generation, on random weights made in-process (issue 37).
bfloat16 is `model.dtype`, the compute's: the weights stay float32, as the learner and the
actors hold them.

    python benchmarks/device.py --shapes qwen2-500m qwen2-1.5b --budget-s 540   # one GPU, < 10 min
    python benchmarks/device.py --allow-cpu --shapes qwen2-25m --rows 1 --length 128 --steps 2 \\
        --slots 1 4 --context 64 --new-tokens 8 --repeats 1 --matmul 512 --budget-s 120   # a smoke test

Each part runs in a fresh process of its own, one at a time, so its compiles, memory and
device peak are its own; this process never starts JAX, so none holds the device while
another needs it. Each may take 0.9 of the device's memory (`XLA_PYTHON_CLIENT_MEM_FRACTION`
unless set; JAX's default, 0.75, would leave 20 GB of an H100 unused).

  peak     `jax.devices()`; without an accelerator the script stops there (exit status 2)
           unless `--allow-cpu`. Then the bfloat16 FLOP/s of a jitted `--matmul` square
           matmul, the best run over 3 s: MFU's peak where `GPU_PEAK_TFLOPS` lacks the
           device, and beside the spec sheet's everywhere (`mfu_matmul`).
  train    per shape, `learner_throughput.measure`: the GRPO train step (its loss, AdamW)
           on `--rows` full rows of `--length` random tokens, compiled (`setup_s`), run once
           untimed, then `--steps` timed. tokens/s; MFU: model FLOPs as learner_throughput
           counts them (6 N + attention) over the spec sheet's dense bfloat16 peak (or the
           measured one); `device_gb`: the most the device's allocator held. A step that
           runs out of device memory is tried again with the next `--remat` (block: each
           block recomputed in the backward pass, so less memory and a lower MFU), then
           the last `--remat` at half the rows, a quarter...; the row's note says so.
  engine   per shape and `--slots` count, `learner.engine.Engine`: that many requests of
           `--context` random tokens, each making `--new-tokens`, timed as the side scripts
           time (`beside/decode_timing.measure`, `beside/tandem_side.run`): prefill and
           decode tokens/s; `setup_s`: the first calls, compiles included.

Budget: the parts run in that order. Each is given what is left of `--budget-s`, less
`--min-part-s` for each part planned after it (but at least `--min-part-s`), and is killed
when that runs out; a part with under `--min-part-s` left is skipped. Its row's note says
which. The table is printed and written, with the peaks and every part's full figures, to
benchmarks/results/device.json (`--out`).
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

import jax
import numpy as np

from harness import ROOT, emit
from learner.config import ModelConfig
from learner.engine import Engine
from learner.model import init_params
from learner.sampling import SamplingParams
from learner.shapes import SHAPES
from learner_throughput import device_peak_bytes, measure, measured_matmul_tflops, mfu, spec_peak_tflops

sys.path.insert(0, str(Path(__file__).resolve().parent / "beside"))  # its scripts import each other as siblings
from decode_timing import measure as measure_generation  # noqa: E402
from tandem_side import run  # noqa: E402

DTYPE = "bfloat16"
COLUMNS = ("shape", "part", "setup", "params_m", "train_tok_s", "mfu", "mfu_matmul", "ms_step",
           "prefill_tok_s", "decode_tok_s", "setup_s", "device_gb", "note")


def probe(allow_cpu: bool, matmul: int) -> dict[str, Any]:
    """The devices; with an accelerator (or `allow_cpu`) also its spec and measured peaks."""
    devices = jax.devices()
    device = devices[0]
    found = {"devices": str(devices), "platform": device.platform, "device_kind": device.device_kind,
             "count": len(devices)}
    if device.platform == "cpu" and not allow_cpu:
        return found
    spec = spec_peak_tflops(device.device_kind, DTYPE) if device.platform == "gpu" else None
    return {**found, "spec_tflops": spec, "matmul_tflops": measured_matmul_tflops(DTYPE, matmul),
            "memory_limit_bytes": (device.memory_stats() or {}).get("bytes_limit")}


def generate(shape: str, slots: int, context: int, new_tokens: int, repeats: int) -> dict[str, Any]:
    """The engine's prefill and decode tokens/s at `shape`, `slots` requests at once."""
    config = ModelConfig(**SHAPES[shape].model_fields(), dtype=DTYPE, max_len=context + new_tokens)
    engine = Engine(config, slots=slots, sampling=SamplingParams(), stop_ids=())
    engine.load(0, init_params(config, 0))
    prompts = np.random.default_rng(0).integers(10, config.vocab_size, (slots, context), dtype=np.int32)
    seeds = itertools.count()
    timing = measure_generation(lambda n: run(engine, prompts, n, next(seeds)), slots=slots, context=context,
                                new_tokens=new_tokens, repeats=repeats)
    return {**timing, "engine_bytes": engine.device_bytes, "compiles": engine.compiles,
            "device_peak_bytes": device_peak_bytes()}


def within(seconds: float, fn: Callable[..., dict], *args) -> tuple[dict | None, str | None]:
    """`fn(*args)` in a fresh spawned process, killed after `seconds`: (its result, None) or
    (None, why not)."""
    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    process = context.Process(target=_reply, args=(send, fn, args))
    process.start()
    send.close()  # the child holds the only writer, so its death reads as EOF
    if not receive.poll(seconds):
        process.kill()
        process.join()
        return None, f"stopped after its {seconds:.0f} s of the budget"
    try:
        status, value = receive.recv()
    except EOFError:
        process.join()
        return None, f"the process died (exit status {process.exitcode})"
    process.join()
    return (value, None) if status == "ok" else (None, value)


def _reply(send, fn: Callable[..., dict], args: tuple) -> None:
    try:
        send.send(("ok", fn(*args)))
    except Exception as error:  # noqa: BLE001: a part failing is its row's note
        send.send(("error", f"{type(error).__name__}: {(str(error).splitlines() or [''])[0]}"))


def out_of_memory(error: str) -> bool:
    return "RESOURCE_EXHAUSTED" in error or "out of memory" in error.lower()


def row(shape: str, part: str, setup: str, **figures) -> dict[str, Any]:
    return {**dict.fromkeys(COLUMNS), "shape": shape, "part": part, "setup": setup,
            "params_m": round(SHAPES[shape].parameters() / 1e6, 1), **figures}


def progress(r: dict[str, Any], elapsed: float) -> None:
    figures = ", ".join(f"{k} {v}" for k, v in r.items() if v is not None and k not in ("shape", "part", "setup"))
    print(f"[{elapsed:.0f} s] {r['part']} {r['shape']} {r['setup']}: {figures}", flush=True)


def gb(n: int | None) -> float | None:
    return None if n is None else round(n / 1e9, 2)


class Budget:
    """Seconds left of the run's budget, shared out among the parts still to run."""

    def __init__(self, seconds: float, min_part_s: float):
        self.deadline, self.min_part_s = time.monotonic() + seconds, min_part_s

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def share(self, later: int) -> float | None:
        """This part's seconds, keeping `min_part_s` for each of `later` parts; None: skip it."""
        left = self.left()
        return None if left < self.min_part_s else max(self.min_part_s, left - later * self.min_part_s)


def train(shape: str, args: argparse.Namespace, host: dict, budget: Budget, later: int) -> tuple[dict, dict | None]:
    """The shape's train row and figures: its first configuration that fits the device."""
    peak, notes = host["spec_tflops"] or host["matmul_tflops"], []
    # Each --remat in turn at --rows, then the last (the leanest) at half the rows, and so on.
    attempts = [(args.rows, remat) for remat in args.remat] + [
        (args.rows >> halvings, args.remat[-1]) for halvings in range(1, args.rows.bit_length())]
    for rows, remat in attempts:
        setup = f"{rows} x {args.length}, remat {remat}"
        seconds = budget.share(later)
        if seconds is None:
            return row(shape, "train", setup, note="; ".join([*notes, f"skipped: {budget.left():.0f} s "
                                                              "of the budget left"])), None
        config = {"model": shape, "dtype": DTYPE, "remat": remat, "mesh": (-1, 1, 1), "rows": rows,
                  "length": args.length, "steps": args.steps}
        result, error = within(seconds, measure, config)
        if error and out_of_memory(error) and (rows, remat) != attempts[-1]:
            notes.append(f"out of memory at {setup}")
            continue
        if error:
            return row(shape, "train", setup, note="; ".join([*notes, error])), None
        devices = result["devices"]
        return row(shape, "train", setup, train_tok_s=round(result["tokens_per_s"], 1),
                   mfu=round(mfu(result, peak * devices), 4),
                   mfu_matmul=round(mfu(result, host["matmul_tflops"] * devices), 4),
                   ms_step=round(result["ms_per_step"], 1), setup_s=round(result["compile_s"], 1),
                   device_gb=gb(result["device_peak_bytes"]), note="; ".join(notes) or None), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=["qwen2-500m", "qwen2-1.5b"])
    parser.add_argument("--budget-s", type=float, default=540.0, help="the whole run's seconds, start-up included")
    parser.add_argument("--min-part-s", type=float, default=60.0, help="seconds kept for each part still to run")
    parser.add_argument("--rows", type=int, default=4, help="train step: rows of --length tokens")
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=10, help="timed train steps, after one untimed")
    parser.add_argument("--remat", nargs="+", choices=["none", "block"], default=["none", "block"],
                        help="tried in turn while the step runs out of device memory")
    parser.add_argument("--slots", type=int, nargs="+", default=[1, 32], help="engine: requests at once")
    parser.add_argument("--context", type=int, default=1024, help="engine: tokens of each request's context")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3, help="engine: timed pairs of calls")
    parser.add_argument("--matmul", type=int, default=8192, help="side of the square matmul that measures the peak")
    parser.add_argument("--allow-cpu", action="store_true", help="run without an accelerator (a smoke test)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "device.json")
    args = parser.parse_args()

    budget = Budget(args.budget_s, args.min_part_s)
    os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.9")  # read by each part's JAX
    host, error = within(budget.left(), probe, args.allow_cpu, args.matmul)
    if error:
        raise SystemExit(f"could not start JAX: {error}")
    print(f"jax.devices(): {host['devices']}")
    if host["platform"] == "cpu" and not args.allow_cpu:
        print("no accelerator: this script measures a GPU (or TPU); --allow-cpu runs it on the CPU "
              "as a smoke test", file=sys.stderr)
        sys.exit(2)
    spec = f"{host['spec_tflops']:.0f} TFLOP/s (spec sheet, dense)" if host["spec_tflops"] else "none known"
    print(f"peak {DTYPE} per device: {spec}; measured {host['matmul_tflops']:.2f} TFLOP/s "
          f"(jitted {args.matmul}^2 matmul); mfu is against the {'spec' if host['spec_tflops'] else 'measured'} "
          "peak, mfu_matmul against the measured one")
    if host["memory_limit_bytes"]:
        print(f"device memory JAX may use: {gb(host['memory_limit_bytes'])} GB", flush=True)

    engine_parts = [(shape, slots) for shape in args.shapes for slots in args.slots]
    rows, details = [], []
    for i, shape in enumerate(args.shapes):
        result_row, result = train(shape, args, host, budget, later=len(args.shapes) - i - 1 + len(engine_parts))
        rows.append(result_row)
        details.append({"part": "train", "shape": shape, **(result or {})})
        progress(result_row, args.budget_s - budget.left())
    for i, (shape, slots) in enumerate(engine_parts):
        setup = f"{slots} slot{'s' * (slots > 1)} x {args.context} + {args.new_tokens}"
        seconds = budget.share(later=len(engine_parts) - i - 1)
        if seconds is None:
            result, error = None, f"skipped: {budget.left():.0f} s of the budget left"
        else:
            result, error = within(seconds, generate, shape, slots, args.context, args.new_tokens, args.repeats)
        rows.append(row(shape, "engine", setup, note=error) if error else row(
            shape, "engine", setup, prefill_tok_s=result["prefill_tokens_per_s"],
            decode_tok_s=result["decode_tokens_per_s"], setup_s=result["first_calls_s"],
            device_gb=gb(result["device_peak_bytes"])))
        details.append({"part": "engine", "shape": shape, "slots": slots, **(result or {})})
        progress(rows[-1], args.budget_s - budget.left())

    emit(f"{DTYPE} on {host['count']} x {host['device_kind']}: train step and engine at LLM shapes, "
         f"{args.budget_s - budget.left():.0f} s of a {args.budget_s:.0f} s budget", rows, args.out,
         host=host, args={k: str(v) for k, v in vars(args).items()}, details=details)


if __name__ == "__main__":
    main()
