import random

import pytest

from tasks.actors.envs import resolve_entrypoint
from tasks.actors.envs.calculator import Calculator

# What a uniformly random policy writes with the spec's tokenizer (specs/calculator.yaml):
# one of the 15 alphabet characters, or nothing (pad, bos and eos decode to "").
RANDOM_ACTIONS = list("0123456789+-*=?") + [""] * 3


def test_call_the_tool_then_answer_with_its_result():
    env = Calculator()
    assert env.reset("3+4") == "3+4"
    assert env.step("=") == ("7", 0.1, False, {"success": False})
    assert env.step("7") == ("", 1.0, True, {"success": True})


def test_bonus_only_for_the_first_call_and_unknown_actions_cost_a_turn():
    env = Calculator(max_steps=3)
    env.reset("9-2")
    assert env.step("=")[:3] == ("7", 0.1, False)
    assert env.step("=x")[:3] == ("7", 0.0, False)
    assert env.step("+") == ("?", 0.0, True, {"success": False})


def test_a_wrong_answer_ends_the_episode_and_only_its_first_character_counts():
    env = Calculator()
    env.reset("2*3")
    assert env.step("5") == ("", 0.0, True, {"success": False})
    env.reset("2*3")
    assert env.step("6??")[1:3] == (1.0, True)


def test_questions_have_one_digit_results_from_the_chosen_ops():
    env = Calculator(ops="*")
    assert {q[1] for q in env.questions} == {"*"} and "3*3" in env.questions and "3*4" not in env.questions
    assert len(Calculator(ops="+").questions) == 55
    assert env.task(random.Random("0:3")) == env.task(random.Random("0:3"))
    with pytest.raises(ValueError, match="not a calculator question"):
        env.reset("3*4")


@pytest.mark.parametrize("kwargs, message", [
    ({"ops": "/"}, "ops must be"), ({"ops": ""}, "ops must be"),
    ({"max_steps": 0}, "max_steps"), ({"tool_bonus": 1.0}, "tool_bonus")])
def test_bad_kwargs(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Calculator(**kwargs)


def test_random_policy_wins_about_9_percent():
    env, rng, episodes = Calculator(), random.Random(0), 20_000
    wins = 0
    for _ in range(episodes):
        env.reset(env.task(rng))
        done = False
        while not done:
            _, _, done, info = env.step(rng.choice(RANDOM_ACTIONS))
        wins += info["success"]
    expected = (1 / 18) * (1 + 8 / 18 + (8 / 18) ** 2)
    assert abs(wins / episodes - expected) < 0.006


def test_builtin_name():
    assert resolve_entrypoint("calculator") is Calculator
