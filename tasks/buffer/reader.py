"""The learner's end of the buffer: groups fetched ahead of need (by `tasks.buffer.exchange`),
taken in arrival order through the exit check.

FIFO in arrival order: groups are kept in the order the Dask queue delivered them, which
is the order actors put them. Staleness is computed when the learner takes a group, against
the learner's current version (README, "Versions, staleness, the buffer").
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Callable, Protocol

from learner.trajectory import Group
from tasks.buffer.intake import IntakeRules
from tasks.buffer.stats import IntakeCounts, IntakeStats

STARVED_LOG_S = 30.0  # a learner waiting this long for groups logs what the buffer knows


class VersionClock(Protocol):
    """The versions the buffer reads (owned by the learner's weight source)."""

    @property
    def current(self) -> int:  # the learner's latest version: the exit check's clock
        ...

    @property
    def visible(self) -> int:  # the latest version the actors can use: admission control's
        ...


class BufferReader:
    """Takes groups for the learner; the exchange thread fills it.

    Args:
      rules: the intake rules (exit check, accounting).
      clock: the learner's versions.
      prefetch: groups fetched ahead at most.
      check: raises if a producer of groups failed (so a starved learner does not wait forever).
    """

    def __init__(self, rules: IntakeRules, clock: VersionClock, *, prefetch: int,
                 check: Callable[[], None] = lambda: None):
        self.rules, self.clock, self.prefetch, self.check = rules, clock, prefetch, check
        self.stats = IntakeStats()
        self.wake = threading.Event()  # set by a take or a starved learner: the exchange looks now
        self._local: collections.deque[Group] = collections.deque()
        self._ready = threading.Condition()
        self._starved = False

    # The exchange's side.
    def room(self) -> int:
        return self.prefetch - len(self._local)

    @property
    def starved(self) -> bool:
        return self._starved

    def arrive(self, groups: list[Group]) -> None:
        """Adds fetched groups, in arrival order."""
        with self._ready:
            self._local.extend(groups)
            self._ready.notify_all()

    def interrupt(self) -> None:
        """Wakes a waiting learner (to find out that the exchange failed)."""
        with self._ready:
            self._ready.notify_all()

    # The learner's side.
    @property
    def depth(self) -> int:
        """Groups in the buffer: in the Dask queue or fetched, not yet taken."""
        return self.rules.ledger.in_buffer

    def take(self, n: int) -> list[Group]:
        """The next `n` groups in arrival order that pass the exit check at the current version."""
        taken: list[Group] = []
        self.rules.want(n)
        try:
            while len(taken) < n:
                group = self._next()
                version = self.clock.current
                staleness = self.rules.on_take(group, version)
                if staleness is not None:
                    taken.append(group)
                    self.stats.taken(staleness, *group.staleness_parts(version))
        except BaseException:  # training stops (or fails) between batches: these stay buffered
            self._put_back(taken)
            raise
        self.wake.set()  # room to prefetch, prompts to dispatch
        return taken

    def _put_back(self, groups: list[Group]) -> None:
        """Returns groups taken for a batch that will not be trained, first in line again:
        a checkpoint then counts them as buffered, and a resumed run plays their prompts again."""
        with self._ready:
            self._local.extendleft(reversed(groups))
        for group in groups:
            self.rules.on_untake(group)

    def pop_stats(self) -> IntakeCounts:
        return self.stats.pop()

    def _next(self) -> Group:
        with self._ready:
            if not self._local:
                self._wait()
            return self._local.popleft()

    def _wait(self) -> None:
        """Until a group arrives; raises if a producer or the exchange failed meanwhile."""
        start = logged = time.perf_counter()
        self._starved = True
        self.wake.set()  # in case the exchange is pausing
        try:
            while not self._local:
                self.check()
                self._ready.wait(timeout=0.5)
                if time.perf_counter() - logged > STARVED_LOG_S:
                    logged = time.perf_counter()
                    self.rules.log(f"the learner has waited {logged - start:.0f}s for groups: "
                                   f"{waiting_words(self.rules.accounting())}")
        finally:
            self._starved = False
            self.stats.waited(time.perf_counter() - start)


def waiting_words(accounting: dict) -> str:
    """What the buffer knows while the learner waits, as a person reads it: "12 groups
    being played, 0 buffered, 340 trained; excluded so far: 51 filtered, 2 aborted"."""
    excluded = ", ".join(f"{n} {reason}" for reason, n in sorted(accounting["excluded"].items(), key=lambda e: -e[1]))
    return (f"{accounting['in_flight']} groups being played, {accounting['buffered']} buffered, "
            f"{accounting['consumed']} trained; excluded so far: {excluded or 'none'}")
