"""Tandem's engine (`learner.engine`) on a Hugging Face model directory, measured as
`benchmarks/llm_shapes.py` measures Tunix's sampler and `transformers` beside it.

`--part decode`: `--slots` requests of `--context` random token ids each (no stop token, so
every request makes `--new-tokens`), submitted at once and stepped until done; the cache
holds `context + new-tokens` positions per slot (`model.max_len`), as the other systems'
static caches do. Timed as every side script times (`decode_timing`). Memory: the engine's
device state (its KV cache, rows and logits) against the KV cache its shape implies, and the
process's peak RSS. One JSON line per run.

`--part memory`: one call as `--part decode` makes it (every slot's context prefilled, then
decoded to `--new-tokens`), untimed: the engine's device bytes and the process's peak RSS
against what the shapes imply (weights, and slots x max_len cached positions); the RSS
before the weights are read (the runtime: Python, JAX, XLA) is printed apart.

`--part compiles`: `--episodes` multi-turn episodes of mixed lengths (a first context of
16..max_len/2 tokens, 1-3 turns of up to `--new-tokens` tokens each followed by an
observation of 4..64 tokens, continued on the episode's warm prefix), `--slots` in flight,
played twice in one process: the distinct shapes the engine compiled, and the seconds each
run took (the first compiles, the second runs compiled code: the difference is the compiles'). Usage:

    python benchmarks/beside/tandem_side.py --model DIR --slots 8 --context 1024 --new-tokens 64
    python benchmarks/beside/tandem_side.py --model DIR --part memory --slots 64 --context 1984
    python benchmarks/beside/tandem_side.py --model DIR --part compiles --context 2048 --episodes 200
"""

from __future__ import annotations

import argparse
import itertools
import json
import time

import jax
import numpy as np
from decode_timing import measure, peak_rss_gb

from learner.config import ModelConfig
from learner.engine import Engine, Request
from learner.hf import load_params
from learner.sampling import SamplingParams


def run(engine: Engine, prompts: np.ndarray, new_tokens: int, seed: int) -> None:
    """Completes one request per prompt."""
    for i, prompt in enumerate(prompts):
        engine.submit(Request(prompt, new_tokens, np.array([seed, i], np.uint32)))
    done = 0
    while done < len(prompts):
        done += len(engine.step())


def compiles(engine: Engine, slots: int, episodes: int, new_tokens: int, vocab: int) -> dict:
    """Plays `episodes` multi-turn episodes of mixed lengths, as many in flight as slots."""
    rng = np.random.default_rng(1)
    window, started, tokens_made = engine.max_len, time.perf_counter(), 0
    plans = [(i, list(rng.integers(10, vocab, rng.integers(16, window // 2))), int(rng.integers(1, 4)))
             for i in range(episodes)]
    live = {}
    while plans or live:
        while plans and len(live) < slots:
            key, context, turns = plans.pop()
            live[engine.submit(Request(np.array(context, np.int32), new_tokens, np.array([key, 0], np.uint32),
                                       prefix_key=key))] = (key, context, turns)
        for done in engine.step():
            key, context, turns = live.pop(done.id)
            tokens_made += len(done.tokens)
            context = context + list(done.tokens) + list(rng.integers(10, vocab, rng.integers(4, 65)))
            if turns > 1 and len(context) + new_tokens < window:
                live[engine.submit(Request(np.array(context, np.int32), new_tokens,
                                           np.array([key, turns], np.uint32), prefix_key=key))] = (key, context, turns - 1)
            else:
                engine.release(key)
    return {"episodes": episodes, "seconds": round(time.perf_counter() - started, 1), "tokens_made": tokens_made,
            "compiles": engine.compiles, "admitted": engine.admitted}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--kv-cache-dtype", choices=("float32", "bfloat16"), default=None,
                        help="the engine's cache; default: the model's dtype")
    parser.add_argument("--part", choices=("decode", "memory", "compiles"), default="decode")
    parser.add_argument("--episodes", type=int, default=200)
    args = parser.parse_args()
    runtime_gb = peak_rss_gb("VmRSS")
    if args.part == "compiles":
        config = ModelConfig(init=args.model, max_len=args.context, dtype=args.dtype)
        engine = Engine(config, slots=args.slots, sampling=SamplingParams(), stop_ids=(),
                        kv_cache_dtype=args.kv_cache_dtype)
        engine.load(0, load_params(config))
        first = compiles(engine, args.slots, args.episodes, args.new_tokens, 30_000)
        again = compiles(engine, args.slots, args.episodes, args.new_tokens, 30_000)
        print(json.dumps({"system": "tandem", "part": "compiles", "model": args.model, "slots": args.slots,
                          "max_len": args.context, **first, "seconds_compiled": again["seconds"],
                          "compiles_after_both": again["compiles"]}))
        return
    config = ModelConfig(init=args.model, max_len=args.context + args.new_tokens, dtype=args.dtype)
    params = jax.device_put(load_params(config))  # the host copy is freed before the cache exists
    engine = Engine(config, slots=args.slots, sampling=SamplingParams(), stop_ids=(),
                    kv_cache_dtype=args.kv_cache_dtype)
    engine.load(0, params)
    rng = np.random.default_rng(0)
    prompts = rng.integers(10, min(config.vocab_size, 30_000), (args.slots, args.context)).astype(np.int32)
    if args.part == "memory":
        started = time.perf_counter()
        run(engine, prompts, args.new_tokens, 0)
        held = engine.device_bytes
        kv_implied = args.slots * config.max_len * config.kv_bytes_per_position(args.kv_cache_dtype)
        print(json.dumps({"system": "tandem", "part": "memory", "model": args.model, "dtype": args.dtype,
                          "slots": args.slots, "max_len": config.max_len, "seconds": round(time.perf_counter() - started, 1),
                          "kv_implied_bytes": kv_implied, **{f"{k}_bytes": v for k, v in held.items()},
                          "implied_bytes": kv_implied + held["weights"], "runtime_rss_gb": runtime_gb,
                          "peak_rss_gb": peak_rss_gb(),
                          "prefill_tokens": engine.prefill_tokens, "compiles": engine.compiles}))
        return
    seeds = itertools.count()
    timing = measure(lambda n: run(engine, prompts, n, next(seeds)), slots=args.slots, context=args.context,
                     new_tokens=args.new_tokens, repeats=args.repeats)
    print(json.dumps({
        "system": "tandem", "jax_version": jax.__version__, "part": "decode", "model": args.model,
        "dtype": args.dtype, "slots": args.slots, "context": args.context, "new_tokens": args.new_tokens,
        "kv_cache_dtype": args.kv_cache_dtype or args.dtype,
        **timing, "kv_implied_bytes": args.slots * config.max_len * config.kv_bytes_per_position(args.kv_cache_dtype),
        **{f"{k}_bytes": v for k, v in engine.device_bytes.items()}, "compiles": engine.compiles,
        "how": "Engine.submit x slots, Engine.step until done; no stop ids"}))


if __name__ == "__main__":
    main()
