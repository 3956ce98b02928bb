"""Calculator: call a tool, then use its result.

The question is one-digit arithmetic with a one-digit result, such as "3+4" or "9-2".
The agent may call the calculator with the action "=": the environment answers with
the result ("7"). An action that starts with a digit is the final answer (only its
first character counts, so a char-level policy need not learn to stop). Any other
action is not understood ("?") and costs a turn. Observations:

    "3+4"  the question (first observation)      "7"  the calculator's result
    "?"    neither a tool call nor an answer

Rewards: 1 for the right answer (success), and `tool_bonus` the first time the tool is
called. Right answers are rare by chance, and calling the tool first is the path to
them; the bonus makes that first step learnable on its own, and keeps calling the tool
worth more than guessing the answer. The episode ends at the answer or after
`max_steps` turns. A uniformly random policy over the spec's 18 tokens answers right
with probability 1/18 per turn and goes on with probability 8/18 (a tool call, an
operator, "?" or an empty action), so it wins (1/18)(1 + 8/18 + (8/18)^2) = 9.1% of
episodes with 3 steps.
"""

from __future__ import annotations

import operator
import random
import string

OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}
TOOL_CALL = "="


class Calculator:
    blocking = False  # pure computation: called on the actor's event loop, not in a thread

    def __init__(self, ops: str = "+-*", max_steps: int = 3, tool_bonus: float = 0.1):
        if not ops or set(ops) - set(OPS):
            raise ValueError(f"ops must be a non-empty subset of {''.join(OPS)!r}, got {ops!r}")
        if max_steps < 1:
            raise ValueError(f"max_steps must be positive, got {max_steps}")
        if not 0 <= tool_bonus < 1:
            raise ValueError(f"tool_bonus must be in [0, 1), below the answer's reward, got {tool_bonus}")
        self.questions = [f"{a}{op}{b}" for op in dict.fromkeys(ops) for a in range(10) for b in range(10)
                          if 0 <= OPS[op](a, b) <= 9]
        self.max_steps = max_steps
        self.tool_bonus = tool_bonus
        self._answer = ""
        self._steps = 0
        self._called = False

    def task(self, rng: random.Random) -> str:
        return rng.choice(self.questions)

    def reset(self, prompt: str) -> str:
        if prompt not in self.questions:
            raise ValueError(f"not a calculator question: {prompt!r}")
        a, op, b = prompt
        self._answer = str(OPS[op](int(a), int(b)))
        self._steps, self._called = 0, False
        return prompt

    def demonstration(self, prompt: str) -> list[str]:
        """The expert's actions (a warm-up's demonstrations): call the tool, answer its result."""
        a, op, b = prompt
        return [TOOL_CALL, str(OPS[op](int(a), int(b)))]

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        self._steps += 1
        first = action[:1]
        if first and first in string.digits:
            won = first == self._answer
            return "", float(won), True, {"success": won}
        out_of_steps = self._steps >= self.max_steps
        if first == TOOL_CALL:
            bonus = 0.0 if self._called else self.tool_bonus
            self._called = True
            return self._answer, bonus, out_of_steps, {"success": False}
        return "?", 0.0, out_of_steps, {"success": False}
