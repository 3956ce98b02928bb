"""The buffer: a `distributed.Queue(maxsize=capacity)` of groups between actors and learner.

Writing and reading are separate objects. Actors write (`BufferWriter`): entry checks,
then a blocking put (backpressure) of the group itself, or of a future whose data stays
on the actor's worker if the group is larger than `buffer.inline_bytes`.
The learner reads (`BufferReader`): a background thread applies actors' reports,
dispatches prompts (`IntakeRules`) and prefetches groups, in one exchange with the Dask
client's event loop per cycle, so the queue's round trips overlap the train step; `take`
applies the exit check in FIFO order.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import threading
import time

from distributed import Client, Event, Future, Queue, get_worker, wait

from learner.trajectory import Group
from tasks.buffer.intake import IntakeRules
from tasks.buffer.channels import Channels


@dataclasses.dataclass
class IntakeStats:
    """Counters since the last `BufferReader.pop_stats`."""

    wait_s: float = 0.0  # learner time waiting on an empty buffer
    wait_count: int = 0
    blocked_s: float = 0.0  # producer time blocked on a full buffer
    staleness: list[int] = dataclasses.field(default_factory=list)  # of consumed groups
    in_flight: list[int] = dataclasses.field(default_factory=list)  # ... gained while generated
    in_queue: list[int] = dataclasses.field(default_factory=list)  # ... gained while buffered
    episodes: int = 0  # episodes of the groups finished (buffered or filtered)
    reward_sum: float = 0.0
    successes: int = 0
    judged: int = 0  # episodes whose environment reported success

    def add_outcomes(self, report: dict) -> None:
        if "episodes" in report:
            self.episodes += report["episodes"]
            self.reward_sum += report["reward_sum"]
            self.successes += report["successes"]
            self.judged += report["judged"]


IDLE_MIN_S, IDLE_MAX_S = 0.005, 0.08  # the intake thread's pause between looks, idle or busy
EXCHANGE_TIMEOUT_S = 120.0  # one look, send or fetch: past this the intake fails, loudly
STARVED_LOG_S = 30.0  # a learner waiting this long for groups logs what the buffer knows

# An item taken from the Dask queue: (its future's key, its group). An inline group has no
# key and is still pickled (bytes); a future's group is None if its data was lost.
Fetched = tuple[str | None, Group | bytes | None]


class BufferReader:
    """The learner's end: prefetch, actor reports, dispatch, exit checks."""

    def __init__(self, channels: Channels, client: Client, rules: IntakeRules, *, capacity: int,
                 prefetch: int, check=lambda: None):
        self.rules, self.version = rules, 0  # `version`: the latest the actors can use, for admission control
        self._client, self._channels = client, channels
        self._queue = Queue(channels.buffer, client=client, maxsize=capacity)
        self._reports = Queue(channels.reports, client=client)
        self._prompts = [Queue(channels.prompts(a), client=client) for a in range(len(rules.held))]
        self._prefetch, self._check = prefetch, check  # check raises if the producers failed
        self._fetch_timeout_s = 15.0  # past this, a group's data counts as lost
        self._local: collections.deque[Group] = collections.deque()
        self._ready = threading.Condition()
        self._stats = IntakeStats()
        self._queued = 0  # groups reported buffered and not yet fetched: at most those queued
        self._closed = threading.Event()
        self._starved = False  # the learner is waiting for a group
        self._wake = threading.Event()  # set by `take` and a starved learner: look now
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

    def release(self) -> None:
        for queue in (self._queue, self._reports, *self._prompts):
            queue.close()

    @property
    def depth(self) -> int:
        """Groups in the buffer: in the Dask queue plus prefetched ones not yet taken."""
        return self._queued + len(self._local)

    def take(self, n: int, version: int) -> list[Group]:
        """The next `n` groups in arrival order that pass the exit check at `version`."""
        taken: list[Group] = []
        self.rules.want(n)
        while len(taken) < n:
            group = self._next_local()
            staleness = self.rules.on_take(group, version)
            if staleness is not None:
                in_flight, in_queue = group.staleness_parts(version)
                self._stats.staleness.append(staleness)
                self._stats.in_flight.append(in_flight)
                self._stats.in_queue.append(in_queue)
                taken.append(group)
        self._wake.set()  # room to prefetch, prompts to dispatch
        return taken

    def pop_stats(self) -> IntakeStats:
        stats, self._stats = self._stats, IntakeStats()
        return stats

    def _next_local(self) -> Group:
        with self._ready:
            if not self._local:
                start = time.perf_counter()
                self._stats.wait_count += 1
                self._starved = True
                self._wake.set()  # in case the intake thread is pausing
                logged = start
                while not self._local:
                    if self._error is not None:
                        raise RuntimeError("buffer intake failed") from self._error
                    self._check()
                    self._ready.wait(timeout=0.5)
                    if time.perf_counter() - logged > STARVED_LOG_S:
                        logged = time.perf_counter()
                        self.rules.log(f"the learner has waited {logged - start:.0f}s for groups: "
                                       f"{self._queued} in the Dask queue, {self.rules.accounting()}")
                self._starved = False
                self._stats.wait_s += time.perf_counter() - start
            return self._local.popleft()

    def _run(self) -> None:
        # Each cycle is one hand-over to the client's event loop and up to two rounds of
        # scheduler requests in flight together; on a learner host without an accelerator
        # their CPU is taken from the train step. So the thread cycles again soon only
        # while the learner could use what it would find (it is waiting, or the prefetch
        # has room and groups are coming); otherwise it waits for a `take`, or at most
        # IDLE_MAX_S, to read the actors' reports.
        pause = IDLE_MIN_S
        try:
            while not self._closed.is_set():
                self._wake.clear()  # a `take` from here on cuts the pause below short
                wanted = max(0, min(self._prefetch - len(self._local), self._queued))
                fetched = self._keep(self._exchange(self._cycle, wanted))
                room = len(self._local) < self._prefetch
                if self._queued and room:
                    pause = 0.0  # groups reported in this cycle: fetch them in the next
                elif self._starved or (fetched and room):
                    pause = IDLE_MIN_S
                elif room:  # room, but nothing arrived: back off
                    pause = min(2 * pause, IDLE_MAX_S)
                else:
                    pause = IDLE_MAX_S
                self._wake.wait(pause)
        except BaseException as e:  # surfaced to the learner by `take`
            if not self._closed.is_set():
                self._error = e
                with self._ready:
                    self._ready.notify_all()

    def _exchange(self, coroutine, *args):
        """Runs `coroutine(*args)` on the client's event loop; a hung scheduler or worker
        fails the intake (and so the learner, which Prefect retries) instead of stalling it."""
        return self._client.sync(coroutine, *args, callback_timeout=EXCHANGE_TIMEOUT_S)

    # Coroutines on the client's event loop, where Queue methods return awaitables.
    async def _cycle(self, n: int) -> list[Fetched]:
        """One look at the queues: `n` groups from the buffer together with the actors'
        reports; then the prompts that the reports make room for."""
        reports, items = await asyncio.gather(self._reports.get(batch=True), self._get_groups(n))
        for report in reports:
            self._stats.blocked_s += report.get("blocked_s", 0.0)
            self._stats.add_outcomes(report)
            self._queued += report["event"] == "buffered"
            self.rules.on_report(report)
        messages = self.rules.dispatch(self.version)
        await asyncio.gather(*(self._prompts[actor].put([p.to_wire() for p in prompts])
                               for actor, prompts in messages.items()))
        return items

    async def _get_groups(self, n: int) -> list[Fetched]:
        """`n` items from the Dask queue, in arrival order; inline groups stay pickled, to be
        unpickled off the event loop.

        `n` counts only groups reported buffered, so the get never blocks: this is the
        queue's only consumer, and an actor reports a group after putting it.
        Every wait is bounded: a future whose worker died mid-fetch turns "lost", and Dask
        then waits for it forever (its data was scattered, so nothing can recompute it).
        """
        if not n:
            return []
        items = await self._queue.get(batch=n)  # inline groups (bytes) and futures
        futures = [item for item in items if isinstance(item, Future)]
        pending = [f for f in futures if f.status == "pending"]  # its state not reported yet
        if pending:
            with contextlib.suppress(TimeoutError):
                await wait(pending, timeout=self._fetch_timeout_s)
        ready = [f for f in futures if f.status == "finished"]
        # One request for all of them (concurrent gathers share it), each with its own outcome.
        fetched = await asyncio.gather(
            *(asyncio.wait_for(self._client.gather(f), self._fetch_timeout_s) for f in ready),
            return_exceptions=True)
        data = {f.key: g for f, g in zip(ready, fetched) if isinstance(g, Group)}
        return [(None, item) if isinstance(item, bytes) else (item.key, data.get(item.key)) for item in items]

    def _keep(self, items: list[Fetched]) -> int:
        """Adds fetched groups to the prefetch, in arrival order; returns how many items
        left the Dask queue."""
        self._queued -= len(items)
        for key, group in items:
            if key is not None:
                self.rules.on_fetch(key, lost=group is None)
        groups = [Group.from_wire(g) if isinstance(g, bytes) else g for _, g in items if g is not None]
        with self._ready:
            self._local.extend(groups)
            self._ready.notify_all()
        return len(items)
