"""Stall: guess-number whose step hangs when told to, for the soak's "an environment call
that hangs" (`benchmarks/soak.py`).

The soak leaves a cue file; the first step anywhere that claims it (an atomic rename: one
call in all the actor processes) sleeps `hang_s`, well past `env.step_timeout_s`, as a
stuck tool call would. Tandem must abort that group, retry its prompt, and never hand the
stuck environment object to another episode.
"""

from __future__ import annotations

import os
import time
import uuid

from tasks.actors.envs.guess_number import GuessNumber


class Stall(GuessNumber):
    blocking = True  # a call that may hang runs in a thread, where its timeout can abandon it

    def __init__(self, cue: str, hang_s: float = 120.0, **kwargs):
        super().__init__(**kwargs)
        self.cue, self.hang_s = cue, hang_s

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        try:
            os.rename(self.cue, f"{self.cue}.taken-{uuid.uuid4().hex}")
        except FileNotFoundError:  # no cue, or another call took it
            pass
        else:
            time.sleep(self.hang_s)
        return super().step(action)
