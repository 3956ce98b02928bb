"""Recall: the agent is shown `length` symbols, one a turn, then asked for the first.

A multi-turn memory task unlike guess-number (no hints to follow, nothing to search):
the answer is an observation several turns back, so the policy must attend to it. The
agent's actions while symbols are shown are ignored. A random answer wins 1/len(symbols).

    reset -> "c"; step(any) -> "a"; step(any) -> "f"; step(any) -> "?"; step("c") -> win
"""

from __future__ import annotations

import random


class Recall:
    blocking = False  # pure computation

    def __init__(self, symbols: str = "abcdef", length: int = 3):
        if len(symbols) < 2 or length < 1:
            raise ValueError("needs at least two symbols and a length of at least 1")
        self.symbols, self.length = symbols, length
        self._sequence, self._shown = "", 0

    def task(self, rng: random.Random) -> str:
        return "".join(rng.choice(self.symbols) for _ in range(self.length))

    def reset(self, prompt: str) -> str:
        self._sequence, self._shown = prompt, 1
        return prompt[0]

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        if self._shown < self.length:
            self._shown += 1
            return self._sequence[self._shown - 1], 0.0, False, {}
        if self._shown == self.length:
            self._shown += 1
            return "?", 0.0, False, {}
        right = action[:1] == self._sequence[0]
        return "", float(right), True, {"success": right}
