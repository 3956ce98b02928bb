"""The watch that ends a run which cannot make progress.

An exclusion now and then is normal. But when every attempt fails the same deterministic
way (observations outside the tokenizer's alphabet; an environment that raises on every
attempt, such as code-exec whose sandbox cannot start), retries and new prompts fail
alike, and the learner would wait for groups forever. The watch sees each exclusion at
the buffer's entry (as the intake's observer) and the count of consumed groups; the
learner asks it while it waits for groups, and it raises `NoProgress` once

  - STREAK attempts have failed for one deterministic cause, with no group consumed since; or
  - STREAK attempts have failed for deterministic causes (several), with no group
    consumed for STALL_S seconds.

Failures that may pass (a timeout, `max_turns`, a worker lost) are not counted; a
filtered group (its episodes played to their end) proves the environment works, and
starts the count again.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Callable

from learner.trajectory import Abort, AbortKind
from tasks.buffer.intake import Exclusion
from tasks.runtime.session.failures import Unrecoverable

STREAK = 32  # attempts failed for one cause, none trained since: not chance, in a run that can progress
STALL_S = 60.0


class NoProgress(Unrecoverable):
    """Every attempt fails the same deterministic way: the run cannot progress."""


@dataclasses.dataclass(frozen=True)
class Cause:
    key: str  # failures with one key fail the same way
    what: str  # what goes wrong, with an example
    fix: str  # what to change
    char: str | None = None  # a character outside the alphabet, and the observation it was in
    observation: str = ""


def classify(abort: Abort, entrypoint: str) -> Cause | None:
    """The deterministic cause of an aborted group, None if it may pass."""
    if abort.kind is AbortKind.ALPHABET:
        return Cause("alphabet", "observations contain characters outside the tokenizer's alphabet",
                     f"add them to model.tokenizer.alphabet, or make the environment ({entrypoint}) "
                     "emit only characters in it", char=repr(abort.about), observation=abort.observation)
    if abort.kind is AbortKind.PROTOCOL:
        return Cause(f"protocol: {abort.about}", f"the environment ({entrypoint}) breaks its protocol: {abort.message}",
                     'fix the environment (README, "Environments")')
    if abort.kind is AbortKind.ENV_ERROR:
        if abort.about == "SandboxUnavailable":
            return Cause("sandbox", f"the code sandbox cannot run on the actors' machines: {abort.error}",
                         "fix that on every Dask worker's machine, or use another environment")
        return Cause(f"env error {abort.about}", f"the environment ({entrypoint}) raises {abort.about}: {abort.error}",
                     "fix the environment or its env.kwargs")
    return None


class ProgressWatch:
    """Counts deterministic failures since the last consumed group; `raise_if_stuck` judges."""

    def __init__(self, consumed: Callable[[], int], entrypoint: str, *, streak: int = STREAK,
                 stall_s: float = STALL_S, clock: Callable[[], float] = time.monotonic):
        self._consumed, self._clock = consumed, clock
        self.entrypoint, self.streak, self.stall_s = entrypoint, streak, stall_s
        self._lock = threading.Lock()  # the intake's thread reports, the learner's asks
        self._seen, self._since = consumed(), clock()
        self._failures: dict[str, tuple[Cause, int]] = {}  # by key: the first cause seen, how many
        self._chars: dict[str, None] = {}  # characters outside the alphabet, in the order seen

    def excluded(self, exclusion: Exclusion) -> None:
        """The intake's observer: an attempt was excluded at the buffer's entry."""
        with self._lock:
            self._catch_up()
            if exclusion.reason == "filtered":  # played to its end: the environment works
                self._restart()
            elif exclusion.abort is not None and (cause := classify(exclusion.abort, self.entrypoint)) is not None:
                first, count = self._failures.get(cause.key, (cause, 0))
                self._failures[cause.key] = (first, count + 1)
                if cause.char is not None:
                    self._chars[cause.char] = None

    def raise_if_stuck(self) -> None:
        """Raises `NoProgress` if the failures seen say no attempt can succeed."""
        with self._lock:
            self._catch_up()
            failed = sum(count for _, count in self._failures.values())
            stalled = self._clock() - self._since
            if failed >= self.streak and (len(self._failures) == 1 or stalled >= self.stall_s):
                raise NoProgress(self._message(failed, stalled))

    def _catch_up(self) -> None:
        consumed = self._consumed()
        if consumed != self._seen:
            self._seen = consumed
            self._restart()

    def _restart(self) -> None:
        self._since = self._clock()
        self._failures.clear()
        self._chars.clear()

    def _message(self, failed: int, stalled: float) -> str:
        causes = sorted(self._failures.values(), key=lambda entry: -entry[1])
        lines = [f"{self._describe(cause)}; {cause.fix}" for cause, _ in causes]
        if len(causes) == 1:
            head = f"no progress is possible: the last {failed} attempts all failed the same way"
            return f"{head}: {lines[0]}. No retry can fix this."
        counts = ", ".join(f"{count} × {cause.key}" for cause, count in causes)
        return (f"no progress is possible: no group was trained for {stalled:.0f}s while {failed} attempts "
                f"failed ({counts}): " + "; ".join(lines) + ". No retry can fix this.")

    def _describe(self, cause: Cause) -> str:
        if cause.char is None:
            return cause.what
        return f"{cause.what}: {', '.join(self._chars)} (e.g. observation {cause.observation})"
