"""`transformers`' `generate` (torch on CPU, a static cache) on a Hugging Face model directory,
measured as `benchmarks/beside/tandem_side.py` measures Tandem's engine: the same prompts'
shapes, sampling at temperature 1 with no top-k or top-p filter, every request making
`--new-tokens` (`min_new_tokens`). Prefill tokens/s from one-token calls, decode tokens/s
from the difference to full calls, medians of `--repeats` after a first call of each. One
JSON line. Usage:

    python benchmarks/beside/transformers_side.py --model DIR --slots 8 --context 1024 --new-tokens 64
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time

import torch
import transformers


def generate(model, prompts: torch.Tensor, new_tokens: int, cache_len: int) -> float:
    started = time.perf_counter()
    with torch.inference_mode():
        model.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=new_tokens,
                       min_new_tokens=new_tokens, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                       cache_implementation="static", cache_config={"max_cache_len": cache_len},
                       pad_token_id=0)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count())
    model = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    generator = torch.Generator().manual_seed(0)
    prompts = torch.randint(10, min(model.config.vocab_size, 30_000), (args.slots, args.context), generator=generator)
    cache_len = args.context + args.new_tokens
    started = time.perf_counter()
    generate(model, prompts, 1, cache_len)
    generate(model, prompts, args.new_tokens, cache_len)
    first_s = time.perf_counter() - started
    t1 = statistics.median(generate(model, prompts, 1, cache_len) for _ in range(args.repeats))
    tn = statistics.median(generate(model, prompts, args.new_tokens, cache_len) for _ in range(args.repeats))
    print(json.dumps({
        "system": "transformers", "transformers_version": transformers.__version__,
        "torch_version": torch.__version__, "torch_threads": torch.get_num_threads(), "part": "decode",
        "model": args.model, "dtype": "float32", "slots": args.slots, "context": args.context,
        "new_tokens": args.new_tokens, "first_calls_s": round(first_s, 2), "prefill_s": round(t1, 4),
        "generate_s": round(tn, 4), "prefill_tokens_per_s": round(args.slots * args.context / t1, 1),
        "decode_tokens_per_s": round(args.slots * (args.new_tokens - 1) / (tn - t1), 2),
        "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20, 2),
        "how": "generate(do_sample, static cache of context + new tokens, min_new_tokens = max_new_tokens)"}))


if __name__ == "__main__":
    main()
