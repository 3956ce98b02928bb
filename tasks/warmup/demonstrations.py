"""A warm-up's data: demonstrations, and the token sequences the policy trains on.

A demonstration is a conversation a correct agent has: each action answers the
observation before it. It becomes a `Sample` exactly as an episode of the actors would
(`tasks.actors.rollout`): the tokenizer's start, each observation framed by the chat
template, each action's tokens and a stop id; the action tokens are the ones trained.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
from pathlib import Path
from typing import Any

import numpy as np

from learner.chat import ChatTokenizer
from learner.config import FieldError
from learner.trajectory import OBSERVATION, Sample
from tasks.buffer.prompts import draw_outside, data_lines
from tasks.config import WarmupConfig

FIELD = "warmup.source"


@dataclasses.dataclass(frozen=True)
class Demonstration:
    observations: tuple[str, ...]
    actions: tuple[str, ...]  # actions[i] answers observations[i]


def demonstrations(config: WarmupConfig, env_class: type, env_kwargs: dict, seed: int,
                   held_out: frozenset[str] = frozenset()) -> list[Demonstration]:
    """The warm-up's demonstrations: the environment expert's on `config.examples` prompts
    (drawn from a stream of their own, "warmup:SEED:i", outside `held_out`, the eval's
    prompts), or the JSONL file's."""
    if config.source != "env":
        return read_demonstrations(Path(config.source))
    env = env_class(**env_kwargs)
    if not callable(getattr(env, "demonstration", None)):
        raise FieldError(FIELD, f"{env_class.__name__} has no demonstration(prompt) method to draw expert "
                         "conversations from; give a .jsonl file of them instead (README, \"Warm-up\")")
    return [played(env, draw_outside(env, f"warmup:{seed}:{i}", held_out)) for i in range(config.examples)]


def played(env: Any, prompt: str) -> Demonstration:
    """The expert's actions on `prompt`, played through `env` for its observations; the
    expert must end the episode with its last action, and win it where `success` is told
    (unless the environment says its expert may lose: `expert_may_lose`, one made careless
    on purpose)."""
    actions = list(_result(env.demonstration(prompt)))
    observations = [_result(env.reset(prompt))]
    for n, action in enumerate(actions, 1):
        observation, _, done, info = _result(env.step(action))
        lost = done and info.get("success") is False and not getattr(env, "expert_may_lose", False)
        if done != (n == len(actions)) or lost:
            what = "ends the episode early" if done and n < len(actions) else (
                "does not end the episode" if not done else "loses")
            raise FieldError(FIELD, f"the expert's demonstration of {prompt!r} {what}: {actions!r}")
        if not done:
            observations.append(observation)
    return Demonstration(tuple(observations), tuple(actions))


def _result(value: Any) -> Any:
    """A method's result, run to its end if the environment's method is `async def`."""
    return asyncio.run(value) if inspect.iscoroutine(value) else value


def read_demonstrations(path: Path) -> list[Demonstration]:
    """One {"observations": [...], "actions": [...]} per line, as many of each, strings."""
    found = []
    for n, line in data_lines(path, FIELD):
        if not line.strip():
            continue
        try:
            record = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise FieldError(FIELD, f"{path} line {n}: not JSON ({e})") from None
        parts = [record.get(k) if isinstance(record, dict) else None for k in ("observations", "actions")]
        if not all(isinstance(p, list) and p and all(isinstance(s, str) for s in p) for p in parts) \
                or len(parts[0]) != len(parts[1]):
            raise FieldError(FIELD, f'{path} line {n}: expected {{"observations": [...], "actions": [...]}}, '
                             "non-empty lists of strings, one action per observation")
        found.append(Demonstration(tuple(parts[0]), tuple(parts[1])))
    if not found:
        raise FieldError(FIELD, f"{path} holds no demonstrations")
    return found


def to_sample(demonstration: Demonstration, tokenizer: ChatTokenizer, max_len: int, index: int) -> Sample:
    """The demonstration as the actors would have recorded it; the agent's tokens (its
    actions and their stop ids) are the generated ones, version 0."""
    tokens, versions = list(tokenizer.start()), []
    versions += [OBSERVATION] * len(tokens)
    try:
        for turn, (observation, action) in enumerate(zip(demonstration.observations, demonstration.actions)):
            framed = tokenizer.observation(observation, first=turn == 0)
            acted = tokenizer.encode(action) + [tokenizer.stop_ids[0]]
            tokens += framed + acted
            versions += [OBSERVATION] * len(framed) + [0] * len(acted)
    except ValueError as e:  # a character the char tokenizer's alphabet lacks
        raise FieldError(FIELD, f"demonstration {index}: {e}") from None
    if len(tokens) > max_len:
        raise FieldError(FIELD, f"demonstration {index} is {len(tokens)} tokens, longer than the context "
                         f"window (model.max_len {max_len})")
    n = len(tokens)
    return Sample(np.asarray(tokens, np.int32), np.zeros(n, np.float32), np.asarray(versions, np.int32), reward=1.0,
                  success=True)
