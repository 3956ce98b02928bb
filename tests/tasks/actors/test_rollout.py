"""Groups played by a real (tiny, random) policy against scripted environments."""

import asyncio
import math
import threading
import time

import jax
import numpy as np
import pytest

from learner.config import ModelConfig, TokenizerConfig
from learner.chat import make_tokenizer
from learner.engine import Request
from learner.model import init_params
from learner.trajectory import OBSERVATION
from tasks.config import ActorsConfig, EnvConfig
from tasks.actors.generation import GenerationService, make_engine
from tasks.actors.rollout import GroupRunner
from tasks.buffer.validation import invalid_reason
from tests.support.waiting import wait_until

MODEL = ModelConfig(d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32, max_len=32,
                    tokenizer=TokenizerConfig(alphabet="abc:!"))


class Countdown:
    """Done after `turns` steps with reward 1; observation ":" each turn."""

    def __init__(self, turns=2, reward=1.0, fail=False):
        self.turns, self.reward, self.fail = turns, reward, fail

    def task(self, rng):
        return "p"

    def reset(self, prompt):
        self.left = self.turns
        return ":"

    def step(self, action):
        if self.fail:
            raise RuntimeError("tool crashed")
        self.left -= 1
        return ":", self.reward if self.left == 0 else 0.0, self.left == 0, {"success": True}


class AsyncCountdown(Countdown):
    async def step(self, action):
        await asyncio.sleep(0.01)
        return Countdown.step(self, action)


class Hang(Countdown):
    def step(self, action):
        time.sleep(5)
        return ":", 0.0, True, {}


@pytest.fixture(scope="module")
def params():
    return jax.device_get(init_params(MODEL, 0))


def service_with(params, version=0, **actors):
    service = GenerationService(make_engine(MODEL, ActorsConfig(slots=16, max_new_tokens=2, **actors))).start()
    service.load(version, params)
    return service


def runner_for(service, max_turns=4, timeout=30.0, step_timeout_s=None, **actors):
    return GroupRunner(service.generate, service.release, make_tokenizer(MODEL),
                       EnvConfig(max_turns=max_turns, episode_timeout_s=timeout, step_timeout_s=step_timeout_s),
                       ActorsConfig(max_new_tokens=2, **actors), MODEL.max_len, seed=0)


def play(env_factory, params, version=0, group_size=3, pin=None, **settings):
    service = service_with(params, version)
    try:
        runner = runner_for(service, **settings)
        return asyncio.run(runner.run(7, "p", 1, [env_factory() for _ in range(group_size)], pin))
    finally:
        service.stop()


def test_group_records_tokens_logprobs_and_versions(params):
    group = play(Countdown, params, version=3)
    assert group.aborted is None and (group.prompt_id, group.attempt) == (7, 1)
    assert len(group.samples) == 3 and list(group.rewards) == [1.0, 1.0, 1.0]
    for s in group.samples:
        assert len(s.tokens) == len(s.logprobs) == len(s.versions)
        assert set(s.versions[s.generated].tolist()) == {3}
        assert np.all(s.logprobs[s.generated] < 0) and np.all(s.logprobs[~s.generated] == 0)
        assert s.versions[0] == OBSERVATION and s.success is True
    assert group.oldest_version == 3 and invalid_reason(group, vocab_size=MODEL.vocab_size, max_len=32) is None


def test_a_group_plays_the_same_alone_or_beside_others(params):
    """Each action's randomness is a function of where it is played (seed, prompt, attempt,
    episode, turn), not of the groups beside it in the engine's batch."""
    service = service_with(params)
    try:
        runner = runner_for(service)
        alone = asyncio.run(runner.run(7, "p", 1, [Countdown(3) for _ in range(3)]))

        async def crowd():
            return await asyncio.gather(*(runner.run(i, "p", 1, [Countdown(3) for _ in range(3)])
                                          for i in range(3, 12)))

        beside = {g.prompt_id: g for g in asyncio.run(crowd())}[7]
    finally:
        service.stop()
    for a, b in zip(alone.samples, beside.samples):
        np.testing.assert_array_equal(a.tokens, b.tokens)
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)


def test_async_environments_work(params):
    assert play(AsyncCountdown, params).aborted is None


def test_environment_error_aborts_the_group(params):
    group = play(lambda: Countdown(fail=True), params)
    assert group.aborted.message == "env error: RuntimeError: tool crashed" and group.samples == ()


def test_max_turns_without_finishing_aborts(params):
    assert "max_turns (2)" in play(lambda: Countdown(turns=5), params, max_turns=2).aborted.message


def test_episode_timeout_aborts(params):
    assert play(Hang, params, timeout=0.5).aborted.message == "timeout after 0.5s"


def test_step_timeout_aborts(params):
    group = play(Hang, params, timeout=30.0, step_timeout_s=0.3)
    assert group.aborted.message == "env step timeout after 0.3s"


class Blocks(Countdown):
    """A stateful tool whose step blocks until `release` is set; records its `close`."""

    def __init__(self, release: threading.Event, closed: list):
        super().__init__()
        self.release, self.closed = release, closed

    def step(self, action):
        self.release.wait(30)
        return super().step(action)

    def close(self):
        self.closed.append(self)


def test_an_env_whose_step_outlives_its_group_is_not_free_until_it_returns(params):
    """A step timeout stops the await, not the thread: the group's environments are still
    inside `step`, so they are retired (`EnvCalls.release`), and closed once it returns."""
    release, closed = threading.Event(), []
    envs = [Blocks(release, closed) for _ in range(3)]
    service = service_with(params)
    try:
        runner = runner_for(service, step_timeout_s=0.2)
        group = asyncio.run(runner.run(7, "p", 1, envs))
        assert group.aborted.message == "env step timeout after 0.2s"
        assert [runner.calls.release(env) for env in envs] == [False, False, False] and closed == []
        release.set()
        wait_until(lambda: len(closed) == 3, "the 3 retired environments closed", timeout_s=30)
        assert sorted(map(id, closed)) == sorted(map(id, envs))
        free = [Countdown() for _ in range(3)]
        assert asyncio.run(runner.run(8, "p", 1, free)).aborted is None
        assert [runner.calls.release(env) for env in free] == [True, True, True]
    finally:
        release.set()
        service.stop()


def test_nan_reward_is_recorded_and_found_invalid(params):
    group = play(lambda: Countdown(reward=math.nan), params)
    assert group.aborted is None
    assert "not finite" in invalid_reason(group, vocab_size=MODEL.vocab_size, max_len=32)


class Publishes(Countdown):
    """Publishes version 1 into `service` at its first step (as the learner would, mid-episode)."""

    service = None

    def step(self, action):
        if self.left == self.turns:
            self.service.load(1, self.new_params)
        return super().step(action)


def play_across_a_publish(params, on_sync):
    service = service_with(params, sync_check_tokens=1)
    Publishes.service, Publishes.new_params = service, jax.tree.map(lambda x: x * 1.5, params)
    try:
        runner = runner_for(service, on_sync=on_sync, sync_check_tokens=1)
        pin = None if on_sync == "retract" else (0, params)
        return asyncio.run(runner.run(7, "p", 1, [Publishes(turns=3) for _ in range(3)], pin))
    finally:
        service.stop()


def test_retract_follows_the_new_version_for_later_actions(params):
    group = play_across_a_publish(params, "retract")
    for s in group.samples:
        versions = s.versions[s.generated].tolist()
        assert versions[0] == 0 and versions[-1] == 1 and versions == sorted(versions)
    assert group.oldest_version == 0 and group.staleness(1) == 1


def test_finish_keeps_the_weights_of_the_group_start(params):
    group = play_across_a_publish(params, "finish")
    assert group.aborted is None
    assert all(set(s.versions[s.generated].tolist()) == {0} for s in group.samples)


def test_abort_drops_the_group_on_a_new_version(params):
    assert "on_sync: abort" in play_across_a_publish(params, "abort").aborted.message


@pytest.mark.parametrize("dist", ["fixed", "uniform", "exponential"])
def test_latency_distributions_keep_their_mean(dist):
    runner = GroupRunner(None, None, None, EnvConfig(latency_s=0.2, latency_dist=dist), ActorsConfig(), 16)
    runner._rng.seed(0)
    draws = np.array([runner._latency() for _ in range(20_000)])
    assert abs(draws.mean() - 0.2) < 0.01 and draws.min() >= 0
    assert (draws.std() < 1e-9) == (dist == "fixed")


def test_a_request_left_behind_by_a_closed_event_loop_does_not_stop_the_service(params):
    """An aborted group cancels its other episodes' requests, which the engine still
    finishes; if their event loop has closed by then (one `asyncio.run` per group, as the
    audit plays), the service drops them and goes on serving the next loop."""
    service = service_with(params)
    try:
        async def abandon():
            request = Request(np.zeros(1, np.int32), 24, np.zeros(2, np.uint32))
            task = asyncio.ensure_future(service.generate(request))
            await asyncio.sleep(0)  # submitted
            task.cancel()

        asyncio.run(abandon())  # closes its loop while the engine decodes the request
        # Admitted, then decoded: its completion found no loop. (`idle` alone also holds
        # before the engine has taken the request from the service's inbox.)
        wait_until(lambda: sum(service.engine.admitted.values()) == 1 and service.engine.idle,
                   "the abandoned request decoded", timeout_s=60)
        group = asyncio.run(runner_for(service).run(7, "p", 1, [Countdown() for _ in range(3)]))
    finally:
        service.stop()
    assert group.aborted is None and len(group.samples) == 3
