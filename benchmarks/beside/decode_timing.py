"""How the side scripts time generation, the same for every system (standard library only,
so Tunix's own environment imports it too).

A call makes `new_tokens` tokens for every one of `slots` prompts of `context` tokens. After
one call of each length (compiles, caches), one-token calls and full calls are timed in
turns, so that drift on a shared machine falls on both alike: prefill tokens/s =
slots x context / median(t1); decode tokens/s = slots x (new - 1) / the median over pairs of
tN - t1, None when a neighbour's load made that difference not positive. Each pair is taken
back to back: at 1,024-token contexts on a CPU the prefill takes several times the decode,
and the difference of medians taken apart moved a decode figure by up to 2x.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def peak_rss_gb(field: str = "VmHWM") -> float:
    """This process's peak resident memory, GB: VmHWM, which starts anew at exec. (Linux's
    ru_maxrss keeps the parent's peak across fork and exec, so a side script started by
    `llm_shapes.py` would report that benchmark's own 2 GiB of bandwidth arrays.) With
    `field` "VmRSS": the resident memory now."""
    with open("/proc/self/status") as status:
        kib = next(int(line.split()[1]) for line in status if line.startswith(f"{field}:"))
    return round(kib * 1024 / 1e9, 3)


def _timed(call: Callable[[int], object], new_tokens: int) -> float:
    started = time.perf_counter()
    call(new_tokens)
    return time.perf_counter() - started


def measure(call: Callable[[int], object], *, slots: int, context: int, new_tokens: int, repeats: int) -> dict:
    """Times `call(n)`, which returns once every prompt has its `n` new tokens (module docstring)."""
    first_s = _timed(call, 1) + _timed(call, new_tokens)
    pairs = [(_timed(call, 1), _timed(call, new_tokens)) for _ in range(repeats)]
    t1, tn = statistics.median(a for a, _ in pairs), statistics.median(b for _, b in pairs)
    decode_s = statistics.median(b - a for a, b in pairs)
    return {"first_calls_s": round(first_s, 2), "prefill_s": round(t1, 4), "generate_s": round(tn, 4),
            "decode_s": round(decode_s, 4), "prefill_tokens_per_s": round(slots * context / t1, 1),
            "decode_tokens_per_s": round(slots * (new_tokens - 1) / decode_s, 2) if decode_s > 0 else None,
            "peak_rss_gb": peak_rss_gb()}
