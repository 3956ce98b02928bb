"""The buffer over a real Dask queue: FIFO in arrival order, entry checks, backpressure."""

import contextlib
import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import numpy as np
import pytest
from distributed import Client, Future, LocalCluster, Queue, get_client

from learner.trajectory import OBSERVATION, Group, Sample, groups_from_wire, groups_to_wire
from tasks.buffer.ledger import Ledger, balanced
from tasks.buffer import exchange as exchange_module
from tasks.actors.pool import ActorPool
from tasks.buffer import channels as channels_module
from tasks.buffer import reader as reader_module
from tasks.buffer.channels import Channels, stop_actors
from tasks.buffer.exchange import Exchange
from tasks.buffer.reader import BufferReader
from tasks.buffer.writer import BufferWriter, EntryChecks
from tasks.config import BufferConfig, DataConfig
from tasks.buffer.prompts import PromptSource
from tasks.actors.envs.guess_number import GuessNumber
from tasks.buffer.filters import zero_variance
from tasks.buffer.intake import IntakeRules, Pace
from tests.conftest import free_port
from tests.support.waiting import wait_until


@pytest.fixture(scope="module")
def client():
    with LocalCluster(n_workers=1, threads_per_worker=3, processes=False, dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        yield client


def make_group(prompt_id, rewards=(0.0, 1.0), reward_nan=False):
    versions = np.array([OBSERVATION, 0], np.int32)
    samples = tuple(Sample(np.array([1, 3], np.int32), np.zeros(2, np.float32), versions,
                           float("nan") if reward_nan else r) for r in rewards)
    return Group(prompt_id, "secret=a", samples, 0.0, 0.0)


def produce(actor, session, prompt_id, delay, inline_bytes=BufferConfig().inline_bytes, **group):
    """An actor's end: wait `delay` (a slow episode), then put the group."""
    time.sleep(delay)
    checks = EntryChecks({"zero_variance": zero_variance}, vocab_size=10, max_len=8)
    writer = BufferWriter(actor, Channels(session), get_client(), checks, inline_bytes)
    writer.add(make_group(prompt_id, **group))
    return writer.flush()


class Version:
    """The learner's versions, fixed at 0: no weights are published here."""

    current = visible = 0


class Buffer:
    """A learner's end of the buffer over Dask: the reader and its exchange thread."""

    def __init__(self, client, session, n_actors=3, capacity=8):
        source = PromptSource(DataConfig(), GuessNumber, {}, seed=0)
        self.rules = IntakeRules(BufferConfig(capacity=capacity), Ledger(), source,
                                 Pace(batch_groups=1, sync_interval=1, outstanding=n_actors), n_actors,
                                 log=lambda _: None)
        self.reader = BufferReader(self.rules, Version(), prefetch=1)
        self.exchange = Exchange(Channels(session), client, self.rules, self.reader, capacity=capacity)

    def take(self):
        return self.reader.take(1)[0]

    def close(self):
        self.exchange.stop()
        self.exchange.release()


def reader_for(client, session, n_actors=3, capacity=8, start=True):
    buffer = Buffer(client, session, n_actors, capacity)
    if start:
        buffer.exchange.start()
    return buffer


def dispatched(buffer, n=3):
    """Waits until the reader has dispatched a prompt to each of the `n` actors (prompt i
    to actor i)."""
    wait_until(lambda: buffer.rules.accounting()["in_flight"] >= n, f"{n} prompts dispatched", timeout_s=10)


def puts_waiting(client, session) -> int:
    """Puts waiting for room in the session's buffer queue: on the scheduler, its
    `asyncio.Queue`'s putters (no public count of them)."""
    return client.run_on_scheduler(_putters, Channels(session).buffer)


def _putters(name, dask_scheduler=None) -> int:
    queue = dask_scheduler.extensions["queues"].queues.get(name)
    return len(queue._putters) if queue is not None else 0


def test_groups_are_taken_in_arrival_order_not_submission_order(client):
    reader = reader_for(client, "fifo")
    try:
        dispatched(reader)  # prompts 0, 1, 2 to actors 0, 1, 2: A, B, C
        # Submitted A, B, C; B finishes first, then C, then A.
        futures = [client.submit(produce, actor, "fifo", actor, delay, pure=False)
                   for actor, delay in ((0, 1.5), (1, 0.1), (2, 0.8))]
        client.gather(futures)
        taken = [reader.take().prompt_id for _ in range(3)]
        assert taken == [1, 2, 0]  # B, C, A
        assert balanced(reader.rules.accounting())
    finally:
        reader.close()


def test_entry_checks_exclude_before_the_buffer(client):
    reader = reader_for(client, "entry")
    try:
        dispatched(reader)
        client.gather([
            client.submit(produce, 0, "entry", 0, 0.0, rewards=(1.0, 1.0), pure=False),  # zero variance
            client.submit(produce, 1, "entry", 1, 0.0, reward_nan=True, pure=False),  # invalid
            client.submit(produce, 2, "entry", 2, 0.0, pure=False)])
        assert reader.take().prompt_id == 2
        wait_until(lambda: sum(reader.rules.accounting()["excluded"].values()) == 2, "2 exclusions", timeout_s=10)
        accounting = reader.rules.accounting()
        assert accounting["excluded"] == {"filtered": 1, "invalid": 1} and balanced(accounting)
    finally:
        reader.close()


def test_a_full_buffer_blocks_the_producer_until_the_learner_takes(client):
    reader = reader_for(client, "full", n_actors=3, capacity=1)
    try:
        dispatched(reader)
        client.gather([client.submit(produce, 0, "full", 0, 0.0, pure=False)])  # fills it (and prefetch)
        client.gather([client.submit(produce, 1, "full", 1, 0.0, pure=False)])  # fills it again
        blocked = client.submit(produce, 2, "full", 2, 0.0, pure=False)
        wait_until(lambda: puts_waiting(client, "full") == 1, "the producer waiting for room", timeout_s=30)
        seen_blocked = time.perf_counter()
        assert not blocked.done()  # waiting for room
        held = time.perf_counter() - seen_blocked
        reader.take()
        assert blocked.result(timeout=10) >= held > 0  # the seconds it was blocked: at least those seen
    finally:
        reader.close()


@pytest.mark.timeout(60)
def test_an_item_put_but_never_reported_does_not_block_the_buffer(client):
    """An actor killed between its put and its report leaves an item nobody reported: the
    starved learner takes it (training nothing of it: its attempt is not open), so the
    next actor's put into the full queue goes through."""
    buffer = reader_for(client, "orphan", n_actors=3, capacity=1)
    try:
        dispatched(buffer)
        Queue(Channels("orphan").buffer, client=client).put(groups_to_wire([make_group(7)]))
        produced = client.submit(produce, 1, "orphan", 1, 0.0, pure=False)
        assert buffer.take().prompt_id == 1  # before the fix: blocked for good (the test's timeout)
        produced.result(timeout=10)
        assert buffer.rules.accounting()["consumed"] == 1
    finally:
        buffer.close()


def test_a_starved_learner_says_what_the_buffer_knows(client, monkeypatch):
    monkeypatch.setattr(reader_module, "STARVED_LOG_S", 0.3)
    logged = []
    reader = reader_for(client, "starved", n_actors=1)
    reader.rules.log = logged.append
    try:
        client.submit(produce, 0, "starved", 0, 1.5, pure=False)  # a slow episode
        assert reader.take().prompt_id == 0
        assert logged and "waited" in logged[0] and "1 groups being played" in logged[0]
    finally:
        reader.close()


def test_a_group_travels_inline_up_to_inline_bytes_and_as_a_future_beyond(client):
    session = "sizes"
    client.submit(produce, 0, session, 0, 0.0, inline_bytes=0, pure=False).result()
    client.submit(produce, 1, session, 1, 0.0, pure=False).result()
    big, small = Queue(Channels(session).buffer, client=client).get(batch=2)
    assert isinstance(big, Future) and isinstance(small, bytes)
    for item, prompt_id in ((big.result(), 0), (groups_from_wire(small)[0], 1)):
        expected = make_group(prompt_id)
        assert (item.prompt_id, item.prompt, item.rewards.tolist()) == (prompt_id, expected.prompt, [0.0, 1.0])
        for got, want in zip(item.samples, expected.samples):
            np.testing.assert_array_equal(got.tokens, want.tokens)
            np.testing.assert_array_equal(got.versions, want.versions)


def _exit():
    os._exit(1)


def test_a_group_whose_worker_died_is_lost_and_retried(monkeypatch):
    # Its data was scattered: once its worker is gone nothing can recompute it.
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        reader = reader_for(client, "died", n_actors=1, capacity=2, start=False)
        monkeypatch.setattr(exchange_module, "FETCH_TIMEOUT_S", 0.5)
        producer = client.submit(produce, 0, "died", 0, 0.0, inline_bytes=0, pure=False)  # a future
        producer.result()
        [worker] = client.who_has()[producer.key]
        with contextlib.suppress(Exception):
            client.run(_exit, workers=[worker])
        reader.exchange.start()
        try:
            wait_until(lambda: reader.rules.accounting()["excluded"].get("lost", 0) >= 1, "the group excluded as lost",
                       timeout_s=60, poll_s=0.1)
            accounting = reader.rules.accounting()
            assert accounting["waiting"] + accounting["in_flight"] == 1 and balanced(accounting)
        finally:
            reader.close()


def blocked_producer(session):
    """An actor blocked on a full buffer until the learner stops it: it puts, then waits for
    its `None` prompt."""
    produce(0, session, 0, 0.0)
    produce(0, session, 1, 0.0)  # blocks: the buffer holds one
    return Queue(Channels(session).prompts(0), client=get_client()).get(timeout=10)


def test_stopping_actors_releases_one_blocked_on_a_full_buffer(client):
    session = "stop"
    Queue(Channels(session).buffer, client=client, maxsize=1)
    actor = client.submit(blocked_producer, session, pure=False)
    wait_until(lambda: puts_waiting(client, session) == 1, "the actor's second put waiting for room", timeout_s=30)
    assert not actor.done()
    assert stop_actors(client, Channels(session), 1, done=actor.done, timeout_s=20)
    assert actor.result() is None  # its stop prompt


@pytest.fixture
def hung_scheduler():
    """A client of a scheduler that stops answering (SIGSTOP): a hung scheduler."""
    port = free_port()
    scheduler = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "dask"), "scheduler", "--host",
                                  "127.0.0.1", "--port", str(port), "--no-dashboard"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with Client(f"tcp://127.0.0.1:{port}", timeout=60) as client:
            os.kill(scheduler.pid, signal.SIGSTOP)
            yield client
            os.kill(scheduler.pid, signal.SIGKILL)
    finally:
        scheduler.kill()
        scheduler.wait()


@pytest.mark.timeout(120)
def test_stopping_actors_gives_up_on_a_hung_scheduler_in_time(hung_scheduler, monkeypatch):
    monkeypatch.setattr(channels_module, "SCHEDULER_TIMEOUT_S", 2.0)
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="telling the actors to stop: the Dask scheduler .* did not answer"):
        stop_actors(hung_scheduler, Channels("hung"), 2)
    warnings = []
    pool = ActorPool(hung_scheduler, SimpleNamespace(channels=Channels("hung")), 2, log=print, warn=warnings.append)
    pool.stop(timeout_s=5)  # the session's cleanup: gives up loudly, does not raise
    assert time.monotonic() - start < 20
    assert len(warnings) == 1 and "could not stop the actors" in warnings[0]
