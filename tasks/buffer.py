"""The buffer: a `distributed.Queue(maxsize=capacity)` of group futures between actors and learner.

Writing and reading are separate objects. Actors write (`BufferWriter`): entry checks,
then a blocking put (backpressure) of a future whose data stays on the actor's worker.
The learner reads (`BufferReader`): a background thread drains actor reports into the
ledger and prefetches groups, so the queue's round trips overlap the train step;
`take` applies the exit check (staleness, computed at take time) in FIFO order.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time

from distributed import Client, Queue, get_worker

from learner.trajectory import Group
from tasks.accounting import Ledger
from tasks.config import BufferConfig
from tasks.data import Prompt, PromptSource
from tasks.filters import Filter


@dataclasses.dataclass(frozen=True)
class Channels:
    """Names of one learner session's Dask queues, variable and event."""

    session: str

    def _name(self, what: str) -> str:
        return f"tandem-{self.session}-{what}"

    @property
    def buffer(self) -> str:
        return self._name("buffer")

    @property
    def prompts(self) -> str:
        return self._name("prompts")

    @property
    def reports(self) -> str:
        return self._name("reports")

    @property
    def weights(self) -> str:
        return self._name("weights")

    @property
    def stop(self) -> str:
        return self._name("stop")


class BufferWriter:
    """An actor's end of the buffer."""

    def __init__(self, channels: Channels, client: Client, filters: dict[str, Filter]):
        self._client, self._filters = client, filters
        self._queue = Queue(channels.buffer, client=client)
        self._reports = Queue(channels.reports, client=client)

    def put(self, group: Group) -> float:
        """Puts `group` unless an entry check excludes it; returns the seconds blocked on a full buffer."""
        if group.aborted:
            return self._report(group, "excluded", reason="aborted", detail=group.aborted)
        for name, keep in self._filters.items():
            if not keep(group):
                return self._report(group, "excluded", reason="filtered", detail=name)
        future = self._client.scatter(group, workers=[get_worker().address], hash=False)
        # No timeout: a timed-out queue op is logged as an error by the scheduler. The
        # learner drains the buffer when it stops, so a blocked put always returns.
        start = time.perf_counter()
        self._queue.put(future)
        blocked = time.perf_counter() - start
        self._report(group, "buffered", blocked_s=blocked)
        return blocked

    def _report(self, group: Group, event: str, **fields) -> float:
        self._reports.put({"event": event, "id": group.prompt_id, "attempt": group.attempt, **fields})
        return 0.0


@dataclasses.dataclass
class IntakeStats:
    """Counters since the last `BufferReader.pop_stats`."""

    wait_s: float = 0.0  # learner time waiting on an empty buffer
    wait_count: int = 0
    blocked_s: float = 0.0  # producer time blocked on a full buffer
    staleness: list[int] = dataclasses.field(default_factory=list)  # of consumed groups


class BufferReader:
    """The learner's end: prefetch, actor reports, exit checks, retries, accounting."""

    def __init__(self, channels: Channels, client: Client, config: BufferConfig,
                 ledger: Ledger, source: PromptSource, *, prefetch: int, outstanding: int,
                 check=lambda: None, log=print):
        self.config, self.ledger, self.source, self.log = config, ledger, source, log
        self._queue = Queue(channels.buffer, client=client, maxsize=config.capacity)
        self._prompts = Queue(channels.prompts, client=client)
        self._reports = Queue(channels.reports, client=client)
        self._prefetch, self._outstanding = prefetch, outstanding
        self._check = check  # raises if the producers failed; called while the learner waits
        self._local: collections.deque[Group] = collections.deque()
        self._ready = threading.Condition()
        self._stats = IntakeStats()
        self._queued = 0  # groups in the Dask queue at the last look
        self._closed = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="tandem-intake", daemon=True)

    def start(self) -> "BufferReader":
        self._thread.start()
        return self

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=10)

    def drain(self) -> int:
        """Empties the Dask queue (so blocked producers return); returns the groups dropped.

        They stay "buffered" in the accounting: a checkpoint lists them to be redone."""
        return len(self._queue.get(batch=True))

    @property
    def depth(self) -> int:
        """Groups in the buffer: in the Dask queue plus prefetched ones not yet taken."""
        return self._queued + len(self._local)

    def take(self, n: int, version: int) -> list[Group]:
        """The next `n` groups in arrival order that pass the staleness check at `version`."""
        taken: list[Group] = []
        while len(taken) < n:
            group = self._next_local()
            staleness = group.staleness(version)
            limit = self.config.max_staleness
            if limit is not None and staleness > limit:
                self._exclude(group.prompt_id, group.attempt, "stale")
                continue
            self.ledger.consume(group.prompt_id, group.attempt)
            self._stats.staleness.append(staleness)
            taken.append(group)
        return taken

    def pop_stats(self) -> IntakeStats:
        stats, self._stats = self._stats, IntakeStats()
        return stats

    def _next_local(self) -> Group:
        with self._ready:
            if not self._local:
                start = time.perf_counter()
                self._stats.wait_count += 1
                while not self._local:
                    if self._error is not None:
                        raise RuntimeError("buffer intake failed") from self._error
                    self._check()
                    self._ready.wait(timeout=0.5)
                self._stats.wait_s += time.perf_counter() - start
            group = self._local.popleft()
            self._ready.notify_all()
            return group

    def _exclude(self, prompt_id: int, attempt: int, reason: str) -> None:
        prompt = self.ledger.exclude(prompt_id, attempt, reason)
        if prompt is None or reason not in self.config.retry or prompt.attempt >= self.config.max_retries:
            return
        self.source.again(Prompt(prompt.id, prompt.text, prompt.attempt + 1))
        self.ledger.retried += 1

    def _run(self) -> None:
        try:
            while not self._closed.is_set():
                self._drain_reports()
                self._dispatch()
                self._fetch()
        except BaseException as e:  # surfaced to the learner by `take`
            if not self._closed.is_set():
                self._error = e
                with self._ready:
                    self._ready.notify_all()

    def _drain_reports(self) -> None:
        for report in self._reports.get(batch=True):
            if report["event"] == "buffered":
                self.ledger.buffered(report["id"], report["attempt"])
                self._stats.blocked_s += report["blocked_s"]
            else:
                if report["reason"] != "filtered":
                    self.log(f"excluded prompt {report['id']} attempt {report['attempt']} "
                             f"({report['reason']}): {report['detail']}")
                self._exclude(report["id"], report["attempt"], report["reason"])

    def _dispatch(self) -> None:
        """Keeps enough prompts out that actors never idle, and no more (bounded asynchrony)."""
        snap = self.ledger.snapshot()
        for _ in range(self._outstanding - snap["in_flight"] - snap["buffered"]):
            prompt = self.source.next()
            self.ledger.dispatched(prompt)
            self._prompts.put(prompt.to_wire())

    def _fetch(self) -> None:
        self._queued = self._queue.qsize()
        if len(self._local) >= self._prefetch or not self._queued:
            time.sleep(0.005)
            return
        group = self._queue.get().result()  # the only consumer: a non-empty queue does not block
        with self._ready:
            self._local.append(group)
            self._ready.notify_all()
