"""The no-progress watch: a run whose attempts all fail the same deterministic way stops with
one error naming the cause and the fix, instead of waiting for groups forever. The
exclusions' details come from the real rollout code (`GroupRunner`), as actors report them."""

import asyncio
import threading
import time

import numpy as np
import pytest

from learner.config import ModelConfig, TokenizerConfig
from learner.engine import Completion
from learner.trajectory import Abort, AbortKind
from tasks.actors.rollout import GroupRunner
from tasks.actors.sandbox.result import SandboxUnavailable
from tasks.buffer.intake import Exclusion
from tasks.buffer.ledger import Ledger
from tasks.buffer.reader import BufferReader
from tasks.config import ActorsConfig, EnvConfig
from tasks.runtime.session.failures import Unrecoverable
from tasks.runtime.session.no_progress import NoProgress, ProgressWatch
from tests.support.groups import make_group, make_rules

MODEL = ModelConfig(d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32, max_len=32,
                    tokenizer=TokenizerConfig(alphabet="abcf01:"))


class Accented:
    """A user's environment whose observations leave the alphabet ("é", then "€")."""

    def __init__(self, observation="café"):
        self.observation = observation

    def reset(self, prompt):
        return self.observation

    def step(self, action):
        return ":", 1.0, True, {}


class NeedsSandbox:
    """As code-exec where its sandbox cannot start: every step raises."""

    def reset(self, prompt):
        return ":"

    def step(self, action):
        raise SandboxUnavailable("not root and Linux 5.10 < 5.14: RLIMIT_NPROC would count every user's processes")


class TimesOut:
    def reset(self, prompt):
        return ":"

    def step(self, action):
        raise TimeoutError


class OneToken:
    """A generation service whose every action is one token."""

    async def generate(self, request):
        return Completion(0, np.array([3], np.int32), np.array([-1.0], np.float32), np.array([0], np.int32), False)

    def release(self, episode):
        pass


def detail(env) -> Exclusion:
    """The exclusion of a group of `env`, as the intake reads its actor's report."""
    runner = GroupRunner.build(OneToken(), EnvConfig(episode_timeout_s=5), ActorsConfig(group_size=2), MODEL)
    group = asyncio.run(runner.run(0, "p", 0, [env, env]))
    assert group.aborted
    return Exclusion("aborted", group.aborted.message, group.aborted)


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def watch(consumed=lambda: 0, **kwargs):
    return ProgressWatch(consumed, "my_envs:Accented", streak=8, **kwargs)


def test_observations_outside_the_alphabet_stop_the_run_naming_the_characters_and_the_fix():
    stuck = watch()
    for observation in ["café"] * 4 + ["10€"] * 4:
        stuck.excluded(detail(Accented(observation)))
    with pytest.raises(NoProgress) as error:
        stuck.raise_if_stuck()
    message = str(error.value)
    assert isinstance(error.value, Unrecoverable)  # Prefect does not retry it
    assert "the last 8 attempts all failed the same way" in message
    assert "characters outside the tokenizer's alphabet: 'é', '€'" in message
    assert "model.tokenizer.alphabet" in message and "my_envs:Accented" in message


def test_an_unavailable_sandbox_stops_the_run_with_its_reason():
    stuck = watch()
    for _ in range(8):
        stuck.excluded(detail(NeedsSandbox()))
    with pytest.raises(NoProgress, match="the code sandbox cannot run on the actors' machines: not root and Linux"):
        stuck.raise_if_stuck()


def test_a_consumed_group_or_a_filtered_one_starts_the_count_again():
    consumed = [0]
    stuck = watch(consumed=lambda: consumed[0])
    for _ in range(7):
        stuck.excluded(detail(NeedsSandbox()))
    consumed[0] += 1  # one group trained: attempts can succeed
    stuck.excluded(detail(NeedsSandbox()))
    stuck.raise_if_stuck()
    for _ in range(7):
        stuck.excluded(detail(NeedsSandbox()))
    stuck.excluded(Exclusion("filtered", "zero_variance"))  # played to its end: the environment works
    stuck.excluded(detail(NeedsSandbox()))
    stuck.raise_if_stuck()


def test_failures_that_may_pass_are_not_counted():
    stuck = watch()
    for _ in range(20):
        stuck.excluded(detail(TimesOut()))
        stuck.excluded(Exclusion("aborted", "max_turns (4) reached", Abort(AbortKind.MAX_TURNS, "max_turns (4) reached")))
        stuck.excluded(Exclusion("lost", ""))
    stuck.raise_if_stuck()


def test_several_deterministic_causes_stop_the_run_once_nothing_was_trained_for_a_while():
    clock = Clock()
    stuck = watch(clock=clock, stall_s=60)
    for i in range(8):
        stuck.excluded(detail(Accented() if i % 2 else NeedsSandbox()))
    stuck.raise_if_stuck()  # two causes: perhaps only some prompts fail
    clock.now = 61
    with pytest.raises(NoProgress, match=r"no group was trained for 61s while 8 attempts failed \(4 × "):
        stuck.raise_if_stuck()


def test_a_starved_learner_stops_instead_of_waiting_forever():
    """The reviewer's run: prompts retried, new ones drawn, every attempt aborted; the learner
    logged "waited 60 s" forever. Here, wired as `build_session` wires it, it raises."""
    ledger = Ledger()
    stuck = ProgressWatch(lambda: ledger.consumed, "my_envs:Accented", streak=16)
    rules = make_rules(n_actors=2, outstanding=8, retry=("aborted",), max_retries=3, ledger=ledger,
                       observers=[stuck.excluded])
    reader = BufferReader(rules, clock=type("Clock", (), {"current": 0, "visible": 0})(), prefetch=4,
                          check=stuck.raise_if_stuck)
    reason, playing = detail(Accented()), threading.Event()

    def actors():  # every attempt aborts at its first observation
        while not playing.is_set():
            for actor, prompts in rules.dispatch(version=0).items():
                for p in prompts:
                    rules.on_report({"event": "excluded", "actor": actor, "id": p.id, "attempt": p.attempt,
                                     "reason": "aborted", "detail": reason.detail, "abort": reason.abort.to_wire()})
            time.sleep(0.01)

    thread = threading.Thread(target=actors, daemon=True)
    thread.start()
    start = time.monotonic()
    try:
        with pytest.raises(NoProgress, match="'é'"):
            reader.take(2)
    finally:
        playing.set()
        thread.join(5)
    assert time.monotonic() - start < 10
    assert rules.accounting()["excluded"]["aborted"] >= 16


def test_a_healthy_run_with_a_few_failing_prompts_goes_on():
    ledger = Ledger()
    stuck = ProgressWatch(lambda: ledger.consumed, "my_envs:Accented", streak=8)
    rules = make_rules(n_actors=1, outstanding=4, ledger=ledger, observers=[stuck.excluded])
    sandbox = detail(NeedsSandbox())
    for _ in range(20):  # one attempt in four fails, the others are trained
        for prompts in rules.dispatch(version=0).values():
            for i, p in enumerate(prompts):
                if i == 0:
                    rules.on_report({"event": "excluded", "actor": 0, "id": p.id, "attempt": p.attempt,
                                     "reason": "aborted", "detail": sandbox.detail, "abort": sandbox.abort.to_wire()})
                else:
                    rules.on_report({"event": "buffered", "actor": 0, "id": p.id, "attempt": p.attempt})
                    rules.on_take(make_group(p.id, attempt=p.attempt), version=0)
        stuck.raise_if_stuck()
