"""Environments: the protocol Tandem drives, the built-ins, and entrypoint resolution.

An environment is any class with these methods, sync or `async def`:

    task(rng: random.Random) -> str                     a new prompt (data.source: env)
    reset(prompt: str) -> str                           the first observation
    step(action: str) -> (obs, reward, done, info)      info["success"] is reported if present

The policy reads and writes only observations and actions; the prompt identifies the
task (a retried prompt replays the same task). Tandem builds one instance per
concurrently running episode, `Class(**env.kwargs)`, and reuses it through `reset`.
"""

from __future__ import annotations

import random
from typing import Any, Protocol

from tasks.actors.envs.calculator import Calculator
from tasks.actors.envs.code_exec import CodeExec
from tasks.actors.envs.guess_number import GuessNumber
from tasks.actors.envs.word_problems import WordProblems
from tasks.entrypoints import load


class Env(Protocol):
    def task(self, rng: random.Random) -> str: ...
    def reset(self, prompt: str) -> Any: ...
    def step(self, action: str) -> Any: ...


BUILTIN: dict[str, type] = {"guess-number": GuessNumber, "calculator": Calculator, "code-exec": CodeExec,
                            "word-problems": WordProblems}


def resolve_entrypoint(entrypoint: str) -> type:
    """The environment class a spec names: a built-in name or "package.module:Class"."""
    return load(entrypoint, BUILTIN, "environment")
