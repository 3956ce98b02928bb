"""`transformers`' `generate` (torch on CPU, a static cache) on a Hugging Face model directory,
measured as `benchmarks/beside/tandem_side.py` measures Tandem's engine: the same prompts'
shapes, sampling at temperature 1 with no top-k or top-p filter, every request making
`--new-tokens` (`min_new_tokens`), timed as every side script times (`decode_timing`). One
JSON line. Usage:

    python benchmarks/beside/transformers_side.py --model DIR --slots 8 --context 1024 --new-tokens 64
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import transformers
from decode_timing import measure


def generate(model, prompts: torch.Tensor, new_tokens: int, cache_len: int) -> None:
    with torch.inference_mode():
        model.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=new_tokens,
                       min_new_tokens=new_tokens, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                       cache_implementation="static", cache_config={"max_cache_len": cache_len},
                       pad_token_id=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--part", choices=("decode",), default="decode")
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count())
    model = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    generator = torch.Generator().manual_seed(0)
    prompts = torch.randint(10, min(model.config.vocab_size, 30_000), (args.slots, args.context), generator=generator)
    cache_len = args.context + args.new_tokens
    timing = measure(lambda n: generate(model, prompts, n, cache_len), slots=args.slots, context=args.context,
                     new_tokens=args.new_tokens, repeats=args.repeats)
    print(json.dumps({
        "system": "transformers", "transformers_version": transformers.__version__,
        "torch_version": torch.__version__, "torch_threads": torch.get_num_threads(), "part": "decode",
        "model": args.model, "dtype": "float32", "slots": args.slots, "context": args.context,
        "new_tokens": args.new_tokens, **timing,
        "how": "generate(do_sample, static cache of context + new tokens, min_new_tokens = max_new_tokens)"}))


if __name__ == "__main__":
    main()
