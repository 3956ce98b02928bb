"""Guess-number: find a hidden letter in a few guesses from higher/lower hints.

The agent must use what earlier turns returned: each hint halves what is left, so a
policy that ignores them does no better than chance, while binary search always wins
(4 guesses find one of up to 15 letters). With 12 letters and 4 guesses a uniformly
random guesser succeeds 1 - (11/12)^4 = 29.4% of the time. Observations are one character, to keep episodes (and training) short:

    ":"  first observation (make a guess)
    ">"  the letter is later in the alphabet      "<"  it is earlier
    "="  correct (reward 1, done)                 "?"  not a letter of the range
"""

from __future__ import annotations

import random
import string


class GuessNumber:
    blocking = False  # pure computation: called on the actor's event loop, not in a thread

    def __init__(self, values: int = 12, max_guesses: int = 4):
        if not 2 <= values <= 26:
            raise ValueError(f"values must be in 2..26, got {values}")
        if max_guesses < 1:
            raise ValueError(f"max_guesses must be positive, got {max_guesses}")
        self.letters = string.ascii_lowercase[:values]
        self.max_guesses = max_guesses
        self._secret = ""
        self._guesses = 0

    def task(self, rng: random.Random) -> str:
        return f"secret={rng.choice(self.letters)}"

    def reset(self, prompt: str) -> str:
        secret = prompt.removeprefix("secret=")
        if secret not in self.letters or len(secret) != 1:
            raise ValueError(f"not a guess-number prompt: {prompt!r}")
        self._secret, self._guesses = secret, 0
        return ":"

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        # The first character is the guess: a char-level policy need not learn to stop.
        guess = action[:1]
        self._guesses += 1
        out_of_guesses = self._guesses >= self.max_guesses
        if guess == self._secret:
            return "=", 1.0, True, {"success": True}
        if guess not in self.letters or not guess:
            hint = "?"
        else:
            hint = ">" if self._secret > guess else "<"
        return hint, 0.0, out_of_guesses, {"success": False}
