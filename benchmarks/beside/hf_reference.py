"""The reference `tunix_side.py --check` compares Tunix against: Hugging Face transformers' own
logits and greedy continuation for a model directory, written to an .npz file.

Run with the product's venv (it has torch and transformers; Tunix's venv has no torch):

    .venv/bin/python benchmarks/beside/hf_reference.py --model DIR --out /tmp/ref.npz

The file holds `ids` (rows of random token ids, eos and pad left out), `logits` (float32,
[rows, tokens, vocab]: `AutoModelForCausalLM`'s forward on `ids`, no cache), `greedy` (the
next `--new-tokens` argmax tokens per row, eos masked out, one full forward per token) and
`eos_ids`. It imports nothing from Tandem.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
import transformers


def special_ids(model_dir: Path) -> list[int]:
    """Token ids a random prompt must not hold: eos (one or several) and pad."""
    config = json.loads((model_dir / "config.json").read_text())
    eos = config.get("eos_token_id")
    ids = list(eos) if isinstance(eos, list) else [eos]
    return sorted({i for i in [*ids, config.get("pad_token_id")] if i is not None})


def random_ids(vocab: int, shape: tuple[int, int], avoid: list[int], seed: int) -> np.ndarray:
    ids = np.random.default_rng(seed).integers(0, vocab, size=shape)
    for bad in avoid:  # move a special id to a neighbour that is not special
        ids[ids == bad] = (bad + 1) % vocab if (bad + 1) % vocab not in avoid else (bad - 1) % vocab
    return ids.astype(np.int32)


@torch.no_grad()
def greedy(model, ids: torch.Tensor, new_tokens: int, eos_ids: list[int]) -> np.ndarray:
    out = []
    for _ in range(new_tokens):
        last = model(ids).logits[:, -1].clone()
        last[:, eos_ids] = -torch.inf
        token = last.argmax(-1, keepdim=True)
        out.append(token)
        ids = torch.cat([ids, token], dim=1)
    return torch.cat(out, dim=1).numpy().astype(np.int32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rows", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=12)
    parser.add_argument("--new-tokens", type=int, default=6)
    args = parser.parse_args()
    model = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    avoid = special_ids(args.model)
    ids = random_ids(model.config.vocab_size, (args.rows, args.tokens), avoid, seed=1)
    with torch.no_grad():
        logits = model(torch.from_numpy(ids).long()).logits.float().numpy()
    cont = greedy(model, torch.from_numpy(ids).long(), args.new_tokens, avoid)
    np.savez(args.out, ids=ids, logits=logits, greedy=cont, eos_ids=np.array(avoid, np.int32))
    print(f"wrote {args.out}: ids {ids.shape}, logits {logits.shape}, greedy {cont.shape}")


if __name__ == "__main__":
    main()
