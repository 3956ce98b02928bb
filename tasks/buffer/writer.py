"""The actors' end of the buffer: entry checks, then a blocking put (backpressure).

A group up to `buffer.inline_bytes` is put into the `distributed.Queue` itself, pickled
into one message; a larger one stays on its actor's worker as a future whose key is put.
Each put or exclusion is reported to the learner on the reports queue.
"""

from __future__ import annotations

import dataclasses
import time

from distributed import Client, Queue, get_worker

from learner.trajectory import Group
from tasks.buffer.channels import Channels
from tasks.buffer.filters import Filter
from tasks.buffer.validation import invalid_reason


@dataclasses.dataclass(frozen=True)
class EntryChecks:
    """What a group must pass to enter the buffer, besides not being aborted."""

    filters: dict[str, Filter]
    vocab_size: int
    max_len: int


class BufferWriter:
    """An actor's end of the buffer."""

    def __init__(self, actor: int, channels: Channels, client: Client, checks: EntryChecks,
                 inline_bytes: int):
        self._actor, self._client, self._checks, self._inline_bytes = actor, client, checks, inline_bytes
        self._queue = Queue(channels.buffer, client=client)
        self._reports = Queue(channels.reports, client=client)

    def hello(self) -> None:
        """Tells the learner this actor (re)started: what a restarted actor held is lost."""
        self._reports.put({"event": "hello", "actor": self._actor})

    def put(self, group: Group) -> float:
        """Puts `group` unless an entry check excludes it; returns the seconds blocked on a full buffer."""
        if group.aborted:
            return self._report(group, "excluded", reason="aborted", detail=group.aborted)
        invalid = invalid_reason(group, vocab_size=self._checks.vocab_size, max_len=self._checks.max_len)
        if invalid:
            return self._report(group, "excluded", reason="invalid", detail=invalid)
        for name, keep in self._checks.filters.items():
            if not keep(group):
                return self._report(group, "excluded", reason="filtered", detail=name, **outcomes(group))
        group.oldest_version  # cached, so computed here and pickled with the group, not in `take`
        if group.nbytes <= self._inline_bytes:
            item, key = group.to_wire(), None
        else:
            item = self._client.scatter(group, workers=[get_worker().address], hash=False)
            key = item.key
        # No timeout: a timed-out queue op is logged as an error by the scheduler. The
        # learner drains the buffer when it stops, so a blocked put always returns.
        start = time.perf_counter()
        self._queue.put(item)
        blocked = time.perf_counter() - start
        self._report(group, "buffered", blocked_s=blocked, key=key, **outcomes(group))
        return blocked

    def _report(self, group: Group, event: str, **fields) -> float:
        self._reports.put({"event": event, "actor": self._actor, "id": group.prompt_id,
                           "attempt": group.attempt, **fields})
        return 0.0


def outcomes(group: Group) -> dict:
    """What the group's episodes scored: the acting policy's performance, whether or not
    the group is trained on (a filter drops exactly the groups that all succeed or all fail)."""
    successes = [s.success for s in group.samples if s.success is not None]
    return {"episodes": len(group.samples), "reward_sum": float(group.rewards.sum()),
            "successes": sum(successes), "judged": len(successes)}
