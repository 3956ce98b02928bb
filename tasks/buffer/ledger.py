"""Where every prompt attempt is: in flight, buffered, consumed at a step, or excluded.

Invariant, at every moment: started = in_flight + buffered + consumed + Σ excluded.
Attempts are keyed by (prompt id, attempt); events may arrive out of order (a group
taken before its "buffered" report reaches the learner), so transitions only ever
move an open attempt forward and ignore reports about closed ones.
"""

from __future__ import annotations

import collections
import threading

from tasks.buffer.prompts import Prompt

IN_FLIGHT, BUFFERED = "in_flight", "buffered"


class Ledger:
    def __init__(self):
        self._lock = threading.Lock()
        # Open attempts: their prompt, state, and the version current when dispatched.
        self._open: dict[tuple[int, int], tuple[Prompt, str, int]] = {}
        self._states: collections.Counter[str] = collections.Counter()  # of open attempts, kept
        # as they move: the intake asks for a snapshot at every dispatch
        self.started = 0
        self.consumed = 0
        self.excluded: collections.Counter[str] = collections.Counter()
        self.retried = 0

    def dispatched(self, prompt: Prompt, version: int = 0) -> None:
        with self._lock:
            self._open[prompt.id, prompt.attempt] = (prompt, IN_FLIGHT, version)
            self._states[IN_FLIGHT] += 1
            self.started += 1

    def buffered(self, prompt_id: int, attempt: int) -> None:
        with self._lock:
            entry = self._open.get((prompt_id, attempt))
            if entry is not None and entry[1] != BUFFERED:
                self._open[prompt_id, attempt] = (entry[0], BUFFERED, entry[2])
                self._states[entry[1]] -= 1
                self._states[BUFFERED] += 1

    def consume(self, prompt_id: int, attempt: int) -> None:
        with self._lock:
            entry = self._open.pop((prompt_id, attempt), None)
            if entry is not None:
                self._states[entry[1]] -= 1
                self.consumed += 1

    def reopen(self, prompt: Prompt, version: int) -> None:
        """Undoes `consume`: the attempt's group is back in the buffer, untrained."""
        with self._lock:
            self._open[prompt.id, prompt.attempt] = (prompt, BUFFERED, version)
            self._states[BUFFERED] += 1
            self.consumed -= 1

    def exclude(self, prompt_id: int, attempt: int, reason: str) -> Prompt | None:
        """Closes the attempt with `reason`; returns its prompt (None if already closed)."""
        with self._lock:
            entry = self._open.pop((prompt_id, attempt), None)
            if entry is None:
                return None
            self._states[entry[1]] -= 1
            self.excluded[reason] += 1
            return entry[0]

    def requeued(self) -> None:
        """An excluded attempt's prompt went back to the data source."""
        with self._lock:
            self.retried += 1

    @property
    def in_buffer(self) -> int:
        """Attempts whose group is in the buffer."""
        return self._states[BUFFERED]

    @property
    def in_flight(self) -> int:
        """Attempts being played (or waiting in an actor's queue)."""
        return self._states[IN_FLIGHT]

    def is_open(self, prompt_id: int, attempt: int) -> bool:
        with self._lock:
            return (prompt_id, attempt) in self._open

    def open_prompts(self) -> list[Prompt]:
        """Prompts in flight or buffered: what a resumed run must generate again."""
        with self._lock:
            return [prompt for prompt, _, _ in self._open.values()]

    def oldest_open_version(self) -> int | None:
        """The earliest version at which a still open attempt was dispatched."""
        with self._lock:
            return min((version for _, _, version in self._open.values()), default=None)

    def snapshot(self) -> dict:
        with self._lock:
            return {
                "started": self.started,
                "in_flight": self._states[IN_FLIGHT],
                "buffered": self._states[BUFFERED],
                "consumed": self.consumed,
                "excluded": dict(self.excluded),
                "retried": self.retried,
            }

    def state(self) -> dict:
        """Checkpointable counters; open attempts are saved apart, as prompts to redo."""
        snap = self.snapshot()
        return {"consumed": snap["consumed"], "excluded": snap["excluded"], "retried": snap["retried"]}

    def restore(self, state: dict) -> None:
        """Restores the closed attempts of a checkpoint; its open ones are redone, so
        they count as started again when dispatched."""
        with self._lock:
            self._open.clear()
            self._states.clear()
            self.consumed = state["consumed"]
            self.excluded = collections.Counter(state["excluded"])
            self.retried = state["retried"]
            self.started = self.consumed + sum(self.excluded.values())


def balanced(snapshot: dict) -> bool:
    """The accounting invariants: over attempts (README, "The run directory") and, where the snapshot has
    them, over prompts (each drawn prompt is in exactly one place)."""
    excluded = sum(snapshot["excluded"].values())
    attempts = snapshot["in_flight"] + snapshot["buffered"] + snapshot["consumed"] + excluded
    if snapshot["started"] != attempts:
        return False
    if "prompts" not in snapshot:
        return True
    return snapshot["prompts"] == attempts - snapshot["retried"] + snapshot["waiting"]
