"""The eval's prompts, held out from training (unless `eval.held_out` is false).

Drawn from the environment, they come from a seed stream of their own ("eval:SEED:j"),
which training's ("SEED:i", `tasks.buffer.prompts`) never reaches; and since an
environment's tasks may repeat across seeds (calculator's small sums, say), training also
holds them out by text: a training draw that is an eval prompt is drawn again.
"""

from __future__ import annotations

import random
from pathlib import Path

from tasks.buffer.prompts import read_jsonl
from tasks.config import EvalConfig

DRAWS_PER_PROMPT = 20  # draws tried per prompt wanted, for n distinct ones


def eval_prompts(config: EvalConfig, env_class: type, env_kwargs: dict) -> list[str]:
    """The eval's distinct prompts, in order: `n` drawn from the environment, or the file's."""
    if config.prompts != "env":
        return list(dict.fromkeys(read_jsonl(Path(config.prompts), field="eval.prompts")))
    env, prompts = env_class(**env_kwargs), {}
    for j in range(config.n * DRAWS_PER_PROMPT):
        prompts.setdefault(env.task(random.Random(f"eval:{config.seed}:{j}")), None)
        if len(prompts) == config.n:
            break
    return list(prompts)


def held_out(config: EvalConfig, env_class: type, env_kwargs: dict) -> frozenset[str]:
    """What training must not draw: the eval's prompts when training evaluates them as
    held out, else none."""
    if config.every is None or not config.held_out:
        return frozenset()
    return frozenset(eval_prompts(config, env_class, env_kwargs))
