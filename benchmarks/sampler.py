"""Sampler throughput with and without the KV cache, at growing prompt+generation lengths.

    python benchmarks/sampler.py [--quick] [--batch 8] [--lengths 64 128 256 512 1024]

For each total length L the window (`max_len`) is L, the prompt L/2 tokens and the
generation L/2 tokens for every row of a group. "cached" is `Sampler.generate`
(prefill, then one cached position per token) timed end to end after a compile;
"no cache" recomputes the whole window for every token, as the sampler did before
the cache, and is timed over a few steps (its cost per step does not depend on
where in the window the step is).
"""

from __future__ import annotations

import argparse
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from learner.config import ModelConfig
from learner.model import forward_fn, init_params
from learner.sampling import Sampler

MODEL = dict(d_model=128, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=512)


@functools.partial(jax.jit, static_argnames=("forward",))
def _recompute_step(forward, params, tokens, lengths, key):
    """One token per row from a full forward pass over the window (no cache)."""
    batch, length = tokens.shape
    positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
    logits = forward(params, tokens, positions, (positions < lengths[:, None]).astype(jnp.int32))
    last = jnp.take_along_axis(logits, (lengths - 1)[:, None, None], axis=1)[:, 0]
    token = jax.random.categorical(key, jax.nn.log_softmax(last))
    return tokens.at[jnp.arange(batch), lengths].set(token), lengths + 1


def time_cached(config: ModelConfig, params, prompts: list[list[int]], new_tokens: int) -> float:
    """Seconds per generated token (all rows together), prefill included."""
    sampler = Sampler(config, stop_ids=())
    run = functools.partial(sampler.generate, params, prompts, max_new_tokens=new_tokens, temperature=1.0)
    run(key=jax.random.key(0))  # compile
    start = time.perf_counter()
    generation = run(key=jax.random.key(1))
    elapsed = time.perf_counter() - start
    if any(len(t) != new_tokens for t in generation.tokens):
        raise RuntimeError("a row stopped early; the timing would not be comparable")
    return elapsed / new_tokens


def time_recompute(config: ModelConfig, params, prompts: list[list[int]], steps: int) -> float:
    """Seconds per generated token when every step runs the whole window."""
    forward = forward_fn(config)
    tokens = np.zeros((len(prompts), config.max_len), np.int32)
    tokens[:, : len(prompts[0])] = prompts
    lengths = jnp.full((len(prompts),), len(prompts[0]), jnp.int32)
    tokens, _ = _recompute_step(forward, params, tokens, lengths, jax.random.key(0))  # compile
    start = time.perf_counter()
    for i in range(steps):
        tokens, lengths = _recompute_step(forward, params, tokens, lengths, jax.random.key(i))
    jax.block_until_ready(tokens)
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer timed no-cache steps, lengths up to 512")
    parser.add_argument("--batch", type=int, default=8, help="rows per group")
    parser.add_argument("--lengths", type=int, nargs="+", default=[64, 128, 256, 512, 1024])
    args = parser.parse_args()
    lengths = [n for n in args.lengths if n <= 512] if args.quick else args.lengths
    steps = 4 if args.quick else 16
    print(f"model {MODEL}, batch {args.batch}, prompt = generation = L/2, {jax.devices()[0].platform}")
    print(f"{'L':>6} {'cached tok/s':>13} {'ms/token':>9} {'no-cache tok/s':>15} {'ms/token':>9} {'speed-up':>9}")
    for total in lengths:
        config = ModelConfig(**MODEL, max_len=total)
        params = jax.device_put(init_params(config, seed=0))
        prompts = [[1] + [3 + (i + r) % 90 for i in range(total // 2 - 1)] for r in range(args.batch)]
        cached = time_cached(config, params, prompts, total // 2)
        recompute = time_recompute(config, params, prompts, steps)
        print(f"{total:>6} {args.batch / cached:>13.0f} {1e3 * cached:>9.2f} "
              f"{args.batch / recompute:>15.0f} {1e3 * recompute:>9.2f} {recompute / cached:>8.1f}x", flush=True)


if __name__ == "__main__":
    main()
