"""The buffer's traffic with Dask, in a thread beside the learner: actors' reports in,
groups in (ahead of need), prompts out.

Each cycle is one hand-over to the Dask client's event loop with its scheduler requests in
flight together, so the queue's round trips overlap the train step. On a learner host
without an accelerator their CPU is taken from the train step, so the thread cycles again
soon only while the learner could use what it would find (it waits, or the prefetch has
room and groups are coming); otherwise it waits for a take, or at most IDLE_MAX_S, to read
the actors' reports.
"""

from __future__ import annotations

import asyncio
import contextlib

from distributed import Client, Future, Queue, wait

from learner.trajectory import Group, groups_from_wire
from tasks.background import Background
from tasks.buffer.channels import Channels
from tasks.buffer.intake import IntakeRules
from tasks.buffer.prompts import prompt_message
from tasks.buffer.reader import BufferReader

IDLE_MIN_S, IDLE_MAX_S = 0.005, 0.08  # the pause between looks, busy or idle
EXCHANGE_TIMEOUT_S = 120.0  # one cycle: past this the exchange fails, loudly
FETCH_TIMEOUT_S = 15.0  # past this, a group's data counts as lost

# An item taken from the Dask queue: (its future's key, its group). Inline groups have no
# key and are still pickled together (bytes); a future's group is None if its data was lost.
Fetched = tuple[str | None, Group | bytes | None]


class Exchange(Background):
    """Moves one session's reports, groups and prompts between Dask and the `reader`."""

    def __init__(self, channels: Channels, client: Client, rules: IntakeRules, reader: BufferReader,
                 *, capacity: int):
        """`capacity`: items (bundles of groups, or a large group's future) the Dask queue holds."""
        super().__init__("tandem-buffer-exchange")
        self._client, self._rules, self._reader = client, rules, reader
        self._queue = Queue(channels.buffer, client=client, maxsize=capacity)
        self._reports = Queue(channels.reports, client=client)
        self._prompts = [Queue(channels.prompts(a), client=client) for a in range(len(rules.held))]
        self._queued = 0  # items reported put and not yet fetched
        # Whether a prompt must be played with the version it was dispatched at, or newer:
        # synchronous mode and admission control count on it (`prompt_message`).
        self._binds_version = rules.pace.synchronous or rules.config.admission

    def release(self) -> None:
        for queue in (self._queue, self._reports, *self._prompts):
            queue.close()

    def _run(self) -> None:
        pause, reader = IDLE_MIN_S, self._reader
        while not self._stopping.is_set():
            reader.wake.clear()  # a take from here on cuts the pause below short
            # A starved learner looks even when nothing was reported: an actor killed between
            # its put and its report leaves an item nobody reported (`_get_groups`).
            fetch = reader.room() > 0 and (self._queued > 0 or reader.starved)
            items, reported = self._client.sync(self._cycle, fetch, callback_timeout=EXCHANGE_TIMEOUT_S)
            # Every item reported in an earlier cycle was in the queue when this one took all
            # there was: only this cycle's reports may name items still on their way.
            self._queued += reported
            if fetch:
                self._queued = max(0, min(reported, self._queued - len(items)))
            self._keep(items)
            room = reader.room() > 0
            if self._queued and room:
                pause = 0.0  # groups reported in this cycle: fetch them in the next
            elif reader.starved or (items and room):
                pause = IDLE_MIN_S
            elif room:  # room, but nothing arrived: back off
                pause = min(2 * pause, IDLE_MAX_S)
            else:
                pause = IDLE_MAX_S
            reader.wake.wait(pause)

    def _wake(self) -> None:
        self._reader.wake.set()

    def _failed(self, error: BaseException) -> None:
        self._reader.interrupt()

    # Coroutines on the client's event loop, where Queue methods return awaitables.
    async def _cycle(self, fetch: bool) -> tuple[list[Fetched], int]:
        """One look at the queues: the buffer's items (if `fetch`) together with the actors'
        reports; then the prompts that the reports make room for. Returns the items and how
        many the reports said were put."""
        messages, items = await asyncio.gather(self._reports.get(batch=True), self._get_groups(fetch))
        reported = 0
        for message in messages:  # one per flush of an actor: what it put, then its reports
            reported += message["items"]
            self._reader.stats.blocked(message.get("blocked_s", 0.0))
            for report in message["reports"]:
                self._reader.stats.reported(report)
                self._rules.on_report(report)
        visible = self._reader.clock.visible
        messages = self._rules.dispatch(visible)
        # Where the version is not binding, an actor starts at once with the weights it
        # holds: each token's version is recorded, and the exit check sees any staleness.
        floor = visible if self._binds_version else 0
        await asyncio.gather(*(self._prompts[actor].put(prompt_message(floor, prompts))
                               for actor, prompts in messages.items()))
        return items, reported

    async def _get_groups(self, fetch: bool) -> list[Fetched]:
        """Every item in the Dask queue, in arrival order (none unless `fetch`); inline groups
        stay pickled, to be unpickled off the event loop.

        All there is, not a count: a get never blocks, and an item whose actor was killed
        after its put and before its report is taken too (its attempts were counted lost
        when the actor restarted, so `IntakeRules.on_take` does not train it). Left in the
        queue, it would hold a place the restarted actor's put waits for. An item taken
        before its report is fine: the ledger closes an attempt from any open state.
        Every wait is bounded: a future whose worker died mid-fetch turns "lost", and Dask
        then waits for it forever (its data was scattered, so nothing can recompute it).
        """
        if not fetch:
            return []
        items = await self._queue.get(batch=True)  # inline groups (bytes, several each) and futures
        futures = [item for item in items if isinstance(item, Future)]
        pending = [f for f in futures if f.status == "pending"]  # its state not reported yet
        if pending:
            with contextlib.suppress(TimeoutError):
                await wait(pending, timeout=FETCH_TIMEOUT_S)
        ready = [f for f in futures if f.status == "finished"]
        # One request for all of them (concurrent gathers share it), each with its own outcome.
        fetched = await asyncio.gather(
            *(asyncio.wait_for(self._client.gather(f), FETCH_TIMEOUT_S) for f in ready),
            return_exceptions=True)
        data = {f.key: g for f, g in zip(ready, fetched) if isinstance(g, Group)}
        return [(None, item) if isinstance(item, bytes) else (item.key, data.get(item.key)) for item in items]

    def _keep(self, items: list[Fetched]) -> None:
        """Hands fetched groups to the reader, in arrival order."""
        for key, group in items:
            if key is not None:
                self._rules.on_fetch(key, lost=group is None)
        groups = []
        for _, item in items:
            if isinstance(item, bytes):
                groups += groups_from_wire(item)
            elif item is not None:
                groups.append(item)
        self._reader.arrive(groups)
