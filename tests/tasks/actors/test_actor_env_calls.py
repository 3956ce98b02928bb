"""Environment calls that hang: the actor (`tasks.actors.actor`) against a stateful tool
whose `step` blocks (`tests.support.fault_envs.OneSessionEach`), with the Dask queues, the
buffer writer and the generation service replaced by in-process fakes; and the threads
blocking environment calls run in (`tasks.actors.env_calls.EnvThreads`)."""

import asyncio
import logging
import queue
import threading

import numpy as np
import pytest

from learner.config import ModelConfig, TokenizerConfig
from learner.engine import Completion
from tasks.actors.actor import ActorSetup, _Actor
from tasks.actors.env_calls import EnvCalls, EnvThreads
from tasks.buffer.channels import Channels
from tasks.buffer.prompts import Prompt, prompt_message
from tasks.config import ActorsConfig, BufferConfig, EnvConfig
from tests.support.fault_envs import OneSessionEach
from tests.support.waiting import wait_until

MODEL = ModelConfig(d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32, max_len=32,
                    tokenizer=TokenizerConfig(alphabet="abc:!"))
DEADLINE_S = 5.0


@pytest.fixture(autouse=True)
def sessions():
    """A fresh log; every hung step released at teardown, so no thread outlives the test."""
    OneSessionEach.fresh()
    yield OneSessionEach
    OneSessionEach.release.set()


class Prompts:
    """The actor's prompt queue (a Dask Queue): what the test puts, the actor gets."""

    def __init__(self):
        self.messages, self.ids = queue.Queue(), 0

    def put(self, *texts: str) -> None:
        for text in texts:
            self.messages.put(prompt_message(0, [Prompt(self.ids, text)]))
            self.ids += 1

    def stop(self) -> None:
        self.messages.put(None)

    def get(self):
        return self.messages.get(timeout=30)


class Writer:
    """The buffer writer: groups added, then sent by the actor's flushes."""

    def __init__(self):
        self.added, self.sent = [], []

    @property
    def pending(self) -> int:
        return len(self.added)

    def hello(self) -> None:
        pass

    def add(self, group) -> None:
        self.added.append(group)

    def flush(self) -> None:
        self.sent += self.added
        self.added = []


class Stop:
    def is_set(self) -> bool:
        return False


class Follower:
    latest = (0, None)

    def wait_first(self):
        return self.latest

    def raise_if_failed(self) -> None:
        pass


class OneToken:
    """A generation service whose every action is one token."""

    version = 0

    class engine:
        compiles, admitted = {}, 0

    def warm_up(self, in_flight: int) -> float:
        return 0.0

    async def generate(self, request):
        return Completion(0, np.array([3], np.int32), np.array([-1.0], np.float32), np.array([0], np.int32), False)

    def release(self, episode) -> None:
        pass


class Running:
    """An actor playing in a thread of its own, fed by `prompts`, writing to `writer`."""

    def __init__(self, groups: int, group_size: int, step_timeout_s: float, prompts=None, service=None):
        env = EnvConfig(entrypoint="tests.support.fault_envs:OneSessionEach", max_turns=2,
                        episode_timeout_s=DEADLINE_S, step_timeout_s=step_timeout_s)
        setup = ActorSetup(Channels("test"), env, ActorsConfig(groups_per_worker=groups, group_size=group_size),
                           BufferConfig(), MODEL, seed=0)
        self.prompts, self.writer = prompts or Prompts(), Writer()
        self.actor = _Actor(0, setup, self.prompts, Stop(), self.writer, service or OneToken(), Follower())
        self.stats: list[dict] = []
        self.thread = threading.Thread(target=lambda: self.stats.append(asyncio.run(self.actor.run())),
                                       daemon=True)
        self.thread.start()

    def sent(self, n: int) -> list:
        """The first `n` groups the actor sent (fails after DEADLINE_S)."""
        until(lambda: len(self.writer.sent) >= n, f"{n} groups sent")
        return self.writer.sent[:n]

    def stop(self) -> dict:
        self.prompts.stop()
        self.thread.join(DEADLINE_S)
        assert self.stats, "the actor did not stop"
        return self.stats[0]


def until(condition, what: str) -> None:
    wait_until(condition, what, timeout_s=DEADLINE_S)


def test_an_environment_whose_call_timed_out_serves_no_other_episode(sessions):
    """The timed-out group's environments are still inside `step` when the next groups
    start: fresh instances play those, and each retired one is closed once its step returns."""
    running = Running(groups=1, group_size=2, step_timeout_s=0.2)
    running.prompts.put("hang", "ok-1", "ok-2", "ok-3")
    groups = running.sent(4)
    assert groups[0].aborted.message == "env step timeout after 0.2s"
    assert [g.aborted for g in groups[1:]] == [None, None, None]
    hung = {id(r[0]) for r in sessions.log if r[2] == "hang"}
    assert len(hung) == 2 and not any(id(r[0]) in hung for r in sessions.log if r[2] != "hang")
    assert not [r for r in sessions.log if r[1] == "close"], "closed while its step still ran"

    sessions.release.set()
    until(lambda: sum(r[1] == "close" and r[4] is not None for r in sessions.log) == 2, "2 closes")
    stats = running.stop()
    assert stats["groups"] == 4 and stats["retired_envs"] == 2
    by_env: dict[int, list] = {}
    for record in sessions.log:
        by_env.setdefault(id(record[0]), []).append(record)
    for records in by_env.values():
        records.sort(key=lambda r: r[3])
        for before, after in zip(records, records[1:]):
            assert after[3] >= before[4], f"{after[1]} of {after[2]!r} began during {before[1]} of {before[2]!r}"
    closes = [r for r in sessions.log if r[1] == "close"]
    assert {id(r[0]) for r in closes} == hung and len(closes) == 2


def test_hung_environment_calls_starve_neither_the_actor_nor_other_episodes(sessions):
    """Far more hung steps than the actor has threads for its environments (4 episodes at
    once) and than the old shared pool had (8): prompts are still read, other groups still
    played and flushed."""
    running = Running(groups=2, group_size=2, step_timeout_s=0.1)
    running.prompts.put(*[f"hang-{i}" for i in range(8)])  # 16 steps that never return
    running.prompts.put(*[f"ok-{i}" for i in range(4)])
    groups = running.sent(12)
    assert sum(g.aborted is not None and g.aborted.message == "env step timeout after 0.1s" for g in groups) == 8
    assert sorted(g.prompt for g in groups if g.aborted is None) == [f"ok-{i}" for i in range(4)]
    running.stop()


def test_the_actor_warms_its_engine_up_before_it_reads_a_prompt(sessions):
    """An episode's clock (`env.episode_timeout_s`) starts with its group: the engine's
    compiles come before the first prompt is read, for as many episodes as the actor plays."""
    order = []

    class Logged(Prompts):
        def get(self):
            order.append("prompt")
            return super().get()

    class Warming(OneToken):
        def warm_up(self, in_flight: int) -> float:
            order.append(f"warm_up({in_flight})")
            return 1.5

    running = Running(groups=3, group_size=2, step_timeout_s=1.0, prompts=Logged(), service=Warming())
    running.prompts.put("ok")
    running.sent(1)
    assert order[:2] == ["warm_up(6)", "prompt"]
    assert running.stop()["compile_s"] == 1.5


def test_a_call_given_up_on_while_it_runs_frees_its_place():
    threads, release = EnvThreads(1), threading.Event()
    hung = threads.submit(release.wait, 30)
    until(hung.running, "the first call started")
    threads.abandon(hung)
    try:
        assert threads.submit(lambda: "next").result(DEADLINE_S) == "next"
    finally:
        release.set()
    assert hung.result(DEADLINE_S) is True


def test_a_call_given_up_on_before_it_starts_never_runs():
    threads, release, ran = EnvThreads(1), threading.Event(), []
    busy = threads.submit(release.wait, 30)
    waiting = threads.submit(ran.append, "waiting")
    threads.abandon(waiting)
    release.set()
    busy.result(DEADLINE_S)
    assert threads.submit(lambda: "after").result(DEADLINE_S) == "after"
    assert waiting.cancelled() and ran == []


def test_past_max_hung_a_hung_call_keeps_its_place_with_one_warning(caplog):
    threads, release = EnvThreads(1, max_hung=1), threading.Event()
    try:
        first = threads.submit(release.wait, 30)
        until(first.running, "the first call started")
        threads.abandon(first)  # replaced: the one hung thread allowed
        second = threads.submit(release.wait, 30)
        until(second.running, "the second call started")
        with caplog.at_level(logging.WARNING, logger="tasks.actors.env_calls"):
            threads.abandon(second)
            threads.abandon(second)
        assert len(caplog.records) == 1 and "max_hung" in caplog.text
        # Whether a call gets a thread is decided inside `submit`, and both threads are held:
        # no new thread, and the call cannot have run.
        before = {t for t in threading.enumerate() if t.name == "tandem-env"}
        third = threads.submit(lambda: "third")
        assert not {t for t in threading.enumerate() if t.name == "tandem-env"} - before
        assert not third.done()  # its place is held by the hung call
    finally:
        release.set()
    assert third.result(DEADLINE_S) == "third"


def test_environment_threads_are_daemons():
    """A call that never returns must not keep the worker process from exiting."""
    assert EnvThreads(1).submit(lambda: threading.current_thread().daemon).result(DEADLINE_S) is True


class CleansUp:
    """An async tool whose cancelled step cleans up (awaits) before it ends; `started` is
    set once its step is under way."""

    def __init__(self, closes: list):
        self.closes, self.started = closes, asyncio.Event()

    async def step(self, action):
        self.started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            await asyncio.sleep(0.05)
            raise

    async def close(self):
        self.closes.append(self)


def test_an_async_call_cancelled_runs_until_its_cleanup_ends_then_its_env_closes():
    async def scenario():
        calls, closes = EnvCalls(), []
        env = CleansUp(closes)
        step = asyncio.ensure_future(calls.call(env, env.step, "a"))
        await asyncio.wait_for(env.started.wait(), DEADLINE_S)
        step.cancel()
        assert calls.release(env) is False and closes == []  # still cleaning up: retired
        with pytest.raises(asyncio.CancelledError):
            await step
        await asyncio.sleep(0)  # the close, scheduled on this loop
        return env, closes

    env, closes = asyncio.run(scenario())
    assert closes == [env]


class FailsToClose:
    """A step that returns once `done` is set (at once, unless `held`: the test then knows
    it is still running when it cancels it); a close that raises."""

    def __init__(self, held=False):
        self.started, self.done = threading.Event(), threading.Event()
        if not held:
            self.done.set()

    def step(self, action):
        self.started.set()
        self.done.wait(30)
        return ":", 0.0, True, {}

    def close(self):
        raise OSError("already gone")


def test_closing_a_retired_env_never_raises(caplog):
    env = FailsToClose(held=True)

    async def scenario():
        calls = EnvCalls(EnvThreads(1))
        step = asyncio.ensure_future(calls.call(env, env.step, "a"))
        assert await asyncio.to_thread(env.started.wait, DEADLINE_S), "the step did not start"
        step.cancel()
        return calls.release(env)

    with caplog.at_level(logging.WARNING, logger="tasks.actors.env_calls"):
        try:
            assert asyncio.run(scenario()) is False
        finally:
            env.done.set()  # the step returns: the retired env is closed
        until(lambda: "closing a retired FailsToClose failed: OSError: already gone" in caplog.text, "the warning")


def test_an_env_whose_calls_returned_is_free_and_not_closed():
    async def scenario():
        calls, env = EnvCalls(), FailsToClose()
        await calls.call(env, env.step, "a")
        return calls.release(env)

    assert asyncio.run(scenario()) is True
