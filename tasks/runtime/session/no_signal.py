"""The watch that ends a run whose groups carry no learning signal.

A group trains the policy only if it reaches the learner: one that an entry filter drops
(every episode got the same reward, so every group-relative advantage is 0), or that is
excluded for any other reason (an invalid reward, an aborted episode, a stale arrival),
teaches nothing. When a policy has collapsed to deterministic play, or an environment
fails every episode, such groups arrive endlessly and the learner would wait for a batch
forever. DAPO's dynamic sampling bounds the same wait (`max_num_gen_batches`, Yu et al.
2025): the learner asks this watch while it waits for a batch, and it raises `NoSignal`
once, since the batch was begun,

  - `learner.max_gen_batches` batches' worth of attempts finished and none could be
    trained in their place, or
  - attempts kept finishing untrained for `learner.no_signal_s` seconds.

Failures of one deterministic cause end the run sooner, as an error
(`tasks.runtime.session.no_progress`); this watch ends it as a stop, on a checkpoint.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Callable

from learner.config import LearnerConfig
from tasks.buffer.intake import Exclusion
from tasks.records.step import StepRecord
from tasks.records.warnings import ENTROPY_WARN

# What each exclusion reason means for learning, in the words the stop message uses.
CAUSES = {
    "filtered": "every group had the same reward in all its episodes (the entry filter drops it: zero advantage)",
    "invalid": "groups were invalid (a reward that is not finite, a token outside the vocabulary, too long)",
    "aborted": "every attempt was aborted",
    "stale": "groups arrived staler than buffer.max_staleness",
    "lost": "groups were lost with their Dask workers",
}


class NoSignal(Exception):
    """No group carrying learning signal arrived within the bound."""

    def __init__(self, excluded: dict[str, int], details: dict[str, str], waited_s: float,
                 successes: int = 0, judged: int = 0):
        super().__init__(f"no group could be trained: {excluded} excluded in {waited_s:.0f}s")
        self.excluded, self.details, self.waited_s = excluded, details, waited_s
        self.successes, self.judged = successes, judged  # over the episodes of the excluded groups

    @property
    def success_rate(self) -> float | None:
        """The acting policy's success over the episodes played while the learner waited."""
        return self.successes / self.judged if self.judged else None


class SignalWatch:
    """Counts the attempts excluded since the learner began its current batch.

    Args:
      excluded: the ledger's exclusions so far, by reason (read, never reset).
      batch_groups: groups a batch needs.
      config: the learner's bounds (`max_gen_batches`, `no_signal_s`; None turns one off).
    """

    def __init__(self, excluded: Callable[[], dict[str, int]], batch_groups: int, config: LearnerConfig,
                 *, clock: Callable[[], float] = time.monotonic):
        self._excluded, self._clock = excluded, clock
        self.max_groups = None if config.max_gen_batches is None else config.max_gen_batches * batch_groups
        self.max_s = config.no_signal_s
        self._lock = threading.Lock()  # the exchange's thread reports, the learner's asks
        self._base: collections.Counter[str] = collections.Counter()
        self._since = clock()
        self._details: dict[str, str] = {}  # the first detail of each reason since the batch began
        self._successes = self._judged = 0  # over the excluded groups' episodes since then

    def batch_started(self) -> None:
        """The learner begins taking a batch: count from here."""
        with self._lock:
            self._base = collections.Counter(self._excluded())
            self._since = self._clock()
            self._details.clear()
            self._successes = self._judged = 0

    def excluded(self, exclusion: Exclusion) -> None:
        """The intake's observer: an attempt was excluded at the buffer's entry."""
        with self._lock:
            self._details.setdefault(exclusion.reason, exclusion.detail)
            self._successes += exclusion.successes
            self._judged += exclusion.judged

    def raise_if_no_signal(self) -> None:
        """Raises `NoSignal` once the batch being taken has waited past a bound."""
        with self._lock:
            counts = collections.Counter(self._excluded())
            counts.subtract(self._base)
            counts = {reason: n for reason, n in counts.items() if n > 0}
            total, waited = sum(counts.values()), self._clock() - self._since
            if not total:
                return
            if (self.max_groups is not None and total >= self.max_groups
                    or self.max_s is not None and waited >= self.max_s):
                raise NoSignal(counts, dict(self._details), waited, self._successes, self._judged)


def describe(no_signal: NoSignal, last: StepRecord | None, config: LearnerConfig) -> str:
    """One line: what arrived instead of signal, and the policy's measured state."""
    counts = sorted(no_signal.excluded.items(), key=lambda item: -item[1])
    main, _ = counts[0]
    cause = CAUSES.get(main, f"groups were excluded ({main})")
    if main in ("aborted", "invalid") and main in no_signal.details:
        cause += f", e.g. {no_signal.details[main][:120]}"
    parts = ", ".join(f"{n} {reason}" for reason, n in counts)
    where = f"after step {last.step}" if last is not None else "before the first step"
    line = (f"no learning signal: {sum(no_signal.excluded.values())} groups finished {where} in "
            f"{no_signal.waited_s:.0f}s and none could be trained ({parts}): {cause}")
    if last is not None and main == "filtered" and (entropy := last.train.get("entropy")) is not None:
        state = "deterministic" if entropy < ENTROPY_WARN else "uncertain"
        success = f" at {last.success_rate:.0%} success" if last.success_rate is not None else ""
        line += f"; entropy {entropy:.3f}: the policy is {state}{success}"
    if sum(no_signal.excluded.values()) < config.batch_groups:
        # A filter drops groups that arrive; this few in the whole wait means few arrived.
        line += (f"; fewer groups than one batch ({config.batch_groups}) finished in all that time: the actors "
                 "delivered almost nothing (stalled or very slow), whatever became of what they did")
    bounds = f"learner.max_gen_batches {config.max_gen_batches}, learner.no_signal_s {config.no_signal_s}"
    return f"{line} ({bounds})"
