"""`tandem new-model SHAPE OUT_DIR`: a randomly initialised model of LLM shape (`learner.shapes`)
as a Hugging Face directory, with a byte-level BPE tokenizer and chat template
(`learner.bpe`), for a spec's `model.init` where no pretrained checkpoint can be downloaded."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from learner.bpe import train
from learner.hf import save_new_model
from learner.shapes import SHAPES


def new_model_command(shape: str, out: Path, *, tokenizer: Path | None, vocab_size: int, seed: int,
                      max_len: int, copy_steps: int = 0) -> int:
    """`tandem new-model`: exit 0, or 1 with the reason."""
    started = time.time()
    if tokenizer is None:
        print(f"Training a BPE tokenizer of {vocab_size} ids on generated text (~10 s; "
              f"--tokenizer DIR reuses one)...", flush=True)
        train(out, vocab_size=vocab_size, seed=seed)
        tokenizer = out
    try:
        copying = save_new_model(SHAPES[shape], out, tokenizer=tokenizer, seed=seed, max_len=max_len,
                                 copy_steps=copy_steps, log=lambda line: print(line, flush=True))
    except ValueError as e:
        print(e, file=sys.stderr)
        return 1
    if copying:
        print(f"copy pretraining: {copy_steps} updates; held-out copies right {copying['copied']:.0%}")
    print(f"{shape} ({SHAPES[shape].parameters() / 1e6:.1f}M parameters, context {max_len}) written to {out} "
          f"in {time.time() - started:.0f} s: a spec uses it as model.init: {out}")
    return 0
