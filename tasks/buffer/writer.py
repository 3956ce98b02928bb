"""The actors' end of the buffer: entry checks, then a blocking put (backpressure).

Groups up to `buffer.inline_bytes` are put into the `distributed.Queue` itself, the small
groups of one flush pickled together into one item; a larger one stays on its actor's
worker as a future whose key is put. Each flush then reports what it put and what the
entry checks excluded to the learner, in one message on the reports queue.
"""

from __future__ import annotations

import dataclasses
import threading
import time

from distributed import Client, Queue, get_worker

from learner.trajectory import Group, groups_to_wire
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
    """An actor's end of the buffer: groups are checked as they finish, and sent together
    at each `flush` (one queue item for all the small ones, and one reports message), so
    the scheduler sees two messages per flush, not two per group.

    `add` and `flush` may run on different threads (the actor's event loop, a thread that
    may block on a full buffer).
    """

    def __init__(self, actor: int, channels: Channels, client: Client, checks: EntryChecks,
                 inline_bytes: int):
        self._actor, self._client, self._checks, self._inline_bytes = actor, client, checks, inline_bytes
        self._queue = Queue(channels.buffer, client=client)
        self._reports = Queue(channels.reports, client=client)
        self._lock = threading.Lock()
        self._groups: list[Group] = []  # passed the entry checks, not yet sent
        self._excluded: list[dict] = []

    def hello(self) -> None:
        """Tells the learner this actor (re)started: what a restarted actor held is lost."""
        self._reports.put({"items": 0, "reports": [{"event": "hello", "actor": self._actor}]})

    @property
    def pending(self) -> int:
        """Groups and exclusions not yet sent."""
        return len(self._groups) + len(self._excluded)

    def add(self, group: Group) -> None:
        """Checks `group` at the buffer's entry; it is sent (or its exclusion reported) at the next flush."""
        reason = self._exclusion(group)
        with self._lock:
            if reason is None:
                group.oldest_version  # cached, so computed here and pickled with the group, not in `take`
                self._groups.append(group)
            else:
                abort = {"abort": group.aborted.to_wire()} if group.aborted else {}  # typed: `intake.Exclusion`
                self._excluded.append(self._report(group, "excluded", reason=reason[0], detail=reason[1], **abort))

    def flush(self) -> float:
        """Sends what was added: the groups (blocking while the buffer is full), then the
        reports. Returns the seconds blocked on a full buffer."""
        with self._lock:
            groups, reports, self._groups, self._excluded = self._groups, self._excluded, [], []
        small = [g for g in groups if g.nbytes <= self._inline_bytes]
        large = [g for g in groups if g.nbytes > self._inline_bytes]
        futures = [self._client.scatter(g, workers=[get_worker().address], hash=False) for g in large]
        items = ([groups_to_wire(small)] if small else []) + futures  # a large group stays on this worker
        # No timeout: a timed-out queue op is logged as an error by the scheduler. The
        # learner drains the buffer when it stops, so a blocked put always returns.
        start = time.perf_counter()
        for item in items:
            self._queue.put(item)
        blocked = time.perf_counter() - start
        reports += [self._report(g, "buffered") for g in small]
        reports += [self._report(g, "buffered", key=f.key) for g, f in zip(large, futures)]
        if reports:
            self._reports.put({"items": len(items), "blocked_s": blocked, "reports": reports})
        return blocked

    def _exclusion(self, group: Group) -> tuple[str, str] | None:
        """(reason, detail) if an entry check excludes `group`."""
        if group.aborted:
            return "aborted", group.aborted.message
        invalid = invalid_reason(group, vocab_size=self._checks.vocab_size, max_len=self._checks.max_len)
        if invalid:
            return "invalid", invalid
        for name, keep in self._checks.filters.items():
            if not keep(group):
                return "filtered", name
        return None

    def _report(self, group: Group, event: str, **fields) -> dict:
        report = {"event": event, "actor": self._actor, "id": group.prompt_id, "attempt": group.attempt, **fields}
        if event == "buffered" or fields.get("reason") == "filtered":  # episodes that played to their end
            report.update(outcomes(group))
        return report


def outcomes(group: Group) -> dict:
    """What the group's episodes scored: the acting policy's performance, whether or not
    the group is trained on (a filter drops exactly the groups that all succeed or all fail)."""
    successes = [s.success for s in group.samples if s.success is not None]
    return {"episodes": len(group.samples), "reward_sum": float(group.rewards.sum()),
            "successes": sum(successes), "judged": len(successes)}
