"""Code execution: write a program whose output is the target, run in the sandbox.

The first observation is the target, a number such as "7". Each action is a Python
expression; the environment runs `print(<action>)` in `tasks.actors.sandbox` (CPU, memory,
output and wall-time limits, no network, its own directory) and compares what it
printed with the target. A right output wins (reward 1, done). Otherwise the agent sees
what its program printed, when that is a number of at most two characters ("5", "-3",
"12"), or "!" (an error, a limit hit, anything longer), and tries again, up to
`attempts` times. With targets 0-9, actions of at most two tokens and the spec's
19-token vocabulary, a uniformly random policy prints the target with probability
0.015 per attempt (e.g. "7" then end-of-text, "+7"): 4.5% of episodes over 3 attempts.

`step` is `async def`: it waits for the subprocess on the actor's event loop instead
of holding a thread, the protocol's async path.
"""

from __future__ import annotations

import random
import re

from tasks.actors import sandbox

SHOWN_OUTPUT = re.compile(r"-?\d|\d\d")  # outputs short enough to show the agent
PURE_ARITHMETIC = re.compile(r"[0-9+\-*() ]*")

# Outputs of programs that are pure arithmetic, shared by every environment of the process
# (an actor process runs dozens): such a program cannot depend on anything but its text and
# the limits, so each distinct one runs in the sandbox once per process, unless it hits a
# limit, which can be the machine's load rather than the program. Per environment instead,
# a random policy's first steps ran ~850 sandboxes (~14 s on 2 cores) for 16 groups.
# Bounded, so that a policy writing ever-new programs cannot grow it without end.
_OUTPUTS: dict[tuple[str, sandbox.Limits], str | None] = {}
_OUTPUTS_MAX = 65_536


class CodeExec:
    def __init__(self, targets: int = 10, attempts: int = 3, limits: dict | None = None):
        if not 1 <= targets <= 100:
            raise ValueError(f"targets must be in 1..100 (targets 0..targets-1), got {targets}")
        if attempts < 1:
            raise ValueError(f"attempts must be positive, got {attempts}")
        try:
            self.limits = sandbox.Limits(**(limits or {}))
        except TypeError as e:
            raise ValueError(f"limits: {e}; known: cpu_s, wall_s, memory_mb, output_bytes, processes") from None
        self.targets = targets
        self.attempts = attempts
        self._target = ""
        self._tries = 0

    def task(self, rng: random.Random) -> str:
        return f"target={rng.randrange(self.targets)}"

    def reset(self, prompt: str) -> str:
        prefix, _, target = prompt.partition("=")
        if prefix != "target" or not target.isdecimal() or str(int(target)) != target \
                or int(target) >= self.targets:
            raise ValueError(f"not a code-exec prompt for targets 0..{self.targets - 1}: {prompt!r}")
        self._target, self._tries = target, 0
        return target

    async def step(self, action: str) -> tuple[str, float, bool, dict]:
        self._tries += 1
        output = await self._output(action)
        if output == self._target:
            return "", 1.0, True, {"success": True}
        shown = output if output is not None and SHOWN_OUTPUT.fullmatch(output) else "!"
        return shown, 0.0, self._tries >= self.attempts, {"success": False}

    async def _output(self, action: str) -> str | None:
        """What `print(action)` printed, stripped; None if it failed or hit a limit."""
        key = (action, self.limits)
        if key in _OUTPUTS:
            return _OUTPUTS[key]
        result = await sandbox.run_async(f"print({action})\n", self.limits)
        output = result.stdout.strip() if result.ok else None
        if PURE_ARITHMETIC.fullmatch(action) and result.killed_reason is None and len(_OUTPUTS) < _OUTPUTS_MAX:
            _OUTPUTS[key] = output
        return output
