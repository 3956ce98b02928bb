"""The buffer's rules, apart from any transport: what to dispatch to which actor, what the
actors' reports mean, and which groups the learner may take.

Pure Python and deterministic, so the rules can be driven through random interleavings
in tests; `tasks.buffer.exchange` moves the messages over Dask.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import threading
from typing import Callable, Sequence

from learner.trajectory import Abort, Group
from tasks.buffer.ledger import Ledger
from tasks.config import BufferConfig
from tasks.buffer.prompts import Prompt, PromptSource


def _locked(method):
    """The learner's thread takes groups while the exchange thread (`tasks.buffer.exchange`) applies reports."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)

    return wrapper


@dataclasses.dataclass(frozen=True)
class Exclusion:
    """An attempt excluded at the buffer's entry, as its actor reported it: the reason
    ("aborted", "invalid", a filter's "filtered", ...), what a person reads, for an
    aborted group why, typed (`learner.trajectory.Abort`), and for a group played to its
    end (a filtered one) how many of its episodes were judged and how many succeeded."""

    reason: str
    detail: str
    abort: Abort | None = None
    successes: int = 0
    judged: int = 0

    @classmethod
    def from_report(cls, report: dict) -> Exclusion:
        wire = report.get("abort")
        return cls(report["reason"], report["detail"], Abort.from_wire(wire) if wire is not None else None,
                   successes=int(report.get("successes", 0)), judged=int(report.get("judged", 0)))


@dataclasses.dataclass(frozen=True)
class Pace:
    """How fast data is consumed: what admission control needs to bound staleness."""

    batch_groups: int  # groups per batch
    sync_interval: int  # learner steps per version
    outstanding: int  # most attempts in flight or buffered at once (bounded asynchrony)
    updates_per_batch: int = 1  # learner steps per batch (minibatches × epochs)
    synchronous: bool = False  # learner.mode sync: generate only what the waiting learner needs

    @property
    def groups_per_version(self) -> float:
        """Groups the learner consumes per version: `batch_groups` every `updates_per_batch`
        steps, and a version every `sync_interval` steps."""
        return groups_per_version(self.batch_groups, self.sync_interval, self.updates_per_batch)


def groups_per_version(batch_groups: int, sync_interval: int, updates_per_batch: int) -> float:
    return batch_groups * sync_interval / updates_per_batch


def outstanding_bound(capacity: int, groups_at_once: int, batch_groups: int) -> int:
    """The most attempts open at once (bounded asynchrony): a full buffer, the batch the
    learner holds and the next, every group the actors play at once, and a quarter more
    waiting in their queues, so that an actor never waits for the learner's next `take`
    to be given a prompt."""
    return capacity + 2 * batch_groups + groups_at_once + groups_at_once // 4 + 2


class IntakeRules:
    """Dispatch, reports and the exit check of one learner session."""

    def __init__(self, config: BufferConfig, ledger: Ledger, source: PromptSource, pace: Pace,
                 n_actors: int, log=print, observers: Sequence[Callable[[Exclusion], None]] = ()):
        """`observers`: told each exclusion at the buffer's entry (the session's watches)."""
        self.config, self.ledger, self.source, self.pace, self.log = config, ledger, source, pace, log
        self.observers = tuple(observers)
        # What each actor holds: its messages in the order sent (its queue is FIFO), each
        # the attempts of one `dispatch` not yet reported, in the order it plays them.
        self.held: list[collections.deque[list[tuple[int, int]]]] = [collections.deque() for _ in range(n_actors)]
        self._hellos = [0] * n_actors
        self._logged: collections.Counter[str] = collections.Counter()
        self._futures = FutureKeys()
        self.wanted = 0  # groups a waiting learner still needs (synchronous mode makes only these)
        self._lock = threading.RLock()

    @_locked
    def accounting(self) -> dict:
        """The ledger's attempt counts plus where every prompt drawn so far is.

        prompts = in_flight + buffered + consumed + Σ excluded − retried + waiting, where a
        retried attempt's prompt is counted again by its next attempt (or as waiting).
        """
        return {**self.ledger.snapshot(), "prompts": self.source.cursor,
                "waiting": len(self.source.waiting)}

    @_locked
    def snapshot(self) -> dict:
        """What a checkpoint records of the intake, all read at one moment (under the lock
        every dispatch, report and take holds, so none falls between the parts): the data
        source's cursor and retries, the closed attempts' counts, and the prompts of the
        open attempts, which a resumed run generates again."""
        return {"data": self.source.state(), "accounting": self.ledger.state(),
                "redo": [p.to_wire() for p in self.ledger.open_prompts()]}

    @_locked
    def restore(self, snapshot: dict) -> None:
        """Restores a `snapshot`: its open attempts' prompts are drawn again first."""
        self.source.restore(snapshot["data"])
        self.ledger.restore(snapshot["accounting"])
        for prompt in snapshot["redo"]:
            self.source.again(Prompt.from_wire(prompt))

    def admissible(self, version: int) -> int:
        """How many new attempts may start now.

        Bounded by `pace.outstanding`; with `buffer.admission`, also by the staleness budget
        (AReaL-style): G groups are consumed per version, so while an attempt dispatched at
        version v is open, at most (v + max_staleness + 1)·G groups may be consumed or open;
        it is then taken at a version ≤ v + max_staleness, whatever order groups arrive in.
        v is the oldest open attempt's (or the current version if none is open).
        In synchronous mode, only what the waiting learner still lacks.
        """
        snap = self.ledger.snapshot()
        open_ = snap["in_flight"] + snap["buffered"]
        room = self.pace.outstanding - open_
        if self.pace.synchronous:
            room = min(room, self.wanted - open_)
        if self.config.admission:
            per_version = self.pace.groups_per_version
            oldest = self.ledger.oldest_open_version()
            oldest = version if oldest is None else oldest
            budget = (oldest + self.config.max_staleness + 1) * per_version
            room = min(room, int(budget) - snap["consumed"] - open_)
        return max(0, room)

    @_locked
    def want(self, n: int) -> None:
        """The learner starts waiting for `n` groups."""
        self.wanted = n

    @_locked
    def dispatch(self, version: int) -> dict[int, list[Prompt]]:
        """Prompts to send now, as one message per actor: each prompt goes to the actor
        holding the fewest. A message is the unit an actor loses if it restarts."""
        out: dict[int, list[Prompt]] = {}
        for _ in range(self.admissible(version)):
            prompt = self.source.next()
            actor = min(range(len(self.held)), key=lambda a: sum(map(len, self.held[a])))  # holds fewest
            if actor not in out:
                self.held[actor].append([])
            self.held[actor][-1].append((prompt.id, prompt.attempt))
            self.ledger.dispatched(prompt, version)
            out.setdefault(actor, []).append(prompt)
        return out

    @_locked
    def on_report(self, report: dict) -> None:
        """An actor's report: hello (it started), buffered, or excluded at entry."""
        event, actor = report["event"], report["actor"]
        if event == "hello":
            self._hellos[actor] += 1
            if self._hellos[actor] > 1:
                # A restarted actor lost every group it was playing (it plays several messages'
                # prompts at once); prompts of messages it had not yet read are lost too: it
                # may play them, but their groups are not trained (`on_take`), only the retries.
                lost = [key for message in self.held[actor] for key in message]
                self.held[actor].clear()
                if lost:
                    self.log(f"actor {actor} restarted; {len(lost)} attempts it held are lost "
                             f"(prompts {sorted(p for p, _ in lost)[:10]}...)")
                for prompt_id, attempt in lost:
                    self.exclude(prompt_id, attempt, "lost")
            return
        key = (report["id"], report["attempt"])
        for message in self.held[actor]:
            if key in message:
                message.remove(key)
                if not message:
                    self.held[actor].remove(message)
                break
        if event == "buffered":
            self.ledger.buffered(*key)
            future_key = report.get("key")
            if future_key is not None and self._futures.buffered(future_key, key):
                self.exclude(*key, "lost")
        else:
            exclusion = Exclusion.from_report(report)
            log_exclusion(self.log, self._logged, key, exclusion.reason, exclusion.detail)
            for observe in self.observers:
                observe(exclusion)
            self.exclude(*key, exclusion.reason)

    @_locked
    def on_fetch(self, future_key: str, *, lost: bool) -> None:
        """The learner fetched a buffered group's data, or found it lost with its worker."""
        if (key := self._futures.fetched(future_key, lost=lost)) is not None:
            self.log(f"prompt {key[0]} attempt {key[1]}: its group was lost with its worker")
            self.exclude(*key, "lost")

    @_locked
    def on_take(self, group: Group, version: int) -> int | None:
        """The exit check: the group's staleness if it is consumed, None if it is not trained
        (excluded as stale, or its attempt already closed)."""
        if not self.ledger.is_open(group.prompt_id, group.attempt):
            # Its actor restarted after putting it and before reporting it, so the attempt was
            # excluded as lost and its prompt sent again: training this group too would train
            # the prompt twice.
            self.log(f"prompt {group.prompt_id} attempt {group.attempt}: its group arrived after the "
                     "attempt was counted lost; not trained")
            return None
        staleness = group.staleness(version)
        limit = self.config.max_staleness
        if limit is not None and staleness > limit:
            self.exclude(group.prompt_id, group.attempt, "stale")
            return None
        self.ledger.consume(group.prompt_id, group.attempt)
        self.wanted = max(0, self.wanted - 1)
        return staleness

    @_locked
    def on_untake(self, group: Group) -> None:
        """A group taken by `on_take` goes back to the buffer untrained (training stopped
        before its batch was complete)."""
        self.ledger.reopen(Prompt(group.prompt_id, group.prompt, group.attempt), group.oldest_version)

    @_locked
    def exclude(self, prompt_id: int, attempt: int, reason: str) -> None:
        """Closes an attempt; retryable reasons send its prompt back, ahead of new ones."""
        prompt = self.ledger.exclude(prompt_id, attempt, reason)
        retry = reason == "lost" or reason in self.config.retry
        if prompt is None or not retry or prompt.attempt >= self.config.max_retries:
            return
        self.source.again(Prompt(prompt.id, prompt.text, prompt.attempt + 1))
        self.ledger.requeued()


def log_exclusion(log, logged: collections.Counter, key: tuple[int, int], reason: str, detail: str,
                  first: int = 3) -> None:
    """Logs the first few exclusions of each reason in detail; metrics count them all."""
    if reason == "filtered" or logged[reason] > first:
        return
    logged[reason] += 1
    more = "; further ones are only counted" if logged[reason] > first else ""
    log(f"excluded prompt {key[0]} attempt {key[1]} ({reason}): {detail}{more}")


class FutureKeys:
    """Buffered groups that travel as futures, by their future's key, to name a group whose
    data was lost with its worker. The learner may fetch a group (or find it lost) before
    its "buffered" report arrives: such keys wait here for the report."""

    def __init__(self):
        self._attempts: dict[str, tuple[int, int]] = {}  # reported, not yet fetched
        self._early: dict[str, bool] = {}  # fetched before reported: whether lost

    def buffered(self, future_key: str, attempt: tuple[int, int]) -> bool:
        """The report of `attempt`'s group; True if its data was already found lost."""
        if future_key in self._early:
            return self._early.pop(future_key)
        self._attempts[future_key] = attempt
        return False

    def fetched(self, future_key: str, *, lost: bool) -> tuple[int, int] | None:
        """A fetch of the group; the attempt whose data was lost, once it is known."""
        attempt = self._attempts.pop(future_key, None)
        if attempt is None:
            self._early[future_key] = lost
        return attempt if lost else None
