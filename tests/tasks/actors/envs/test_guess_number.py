import random

import pytest

from tasks.actors.envs import resolve_entrypoint
from tasks.actors.envs.guess_number import GuessNumber


def play(env, prompt, guesses):
    env.reset(prompt)
    for guess in guesses:
        obs, reward, done, info = env.step(guess)
        if done:
            return reward, info["success"]
    return 0.0, False


def test_hints_point_to_the_secret():
    env = GuessNumber(values=16, max_guesses=5)
    assert env.reset("secret=f") == ":"
    assert env.step("c")[:3] == (">", 0.0, False)
    assert env.step("k")[:3] == ("<", 0.0, False)
    assert env.step("z")[:3] == ("?", 0.0, False)
    assert env.step("fgh") == ("=", 1.0, True, {"success": True})


def test_episode_ends_after_max_guesses():
    env = GuessNumber(values=16, max_guesses=2)
    env.reset("secret=a")
    assert env.step("b")[2] is False
    obs, reward, done, info = env.step("c")
    assert done and reward == 0.0 and info == {"success": False}


def test_binary_search_always_wins():
    env = GuessNumber()
    for secret in env.letters:
        env.reset(f"secret={secret}")
        lo, hi = 0, len(env.letters) - 1
        while True:
            mid = (lo + hi) // 2
            obs, reward, done, _ = env.step(env.letters[mid])
            if obs == "=":
                break
            assert not done
            lo, hi = (mid + 1, hi) if obs == ">" else (lo, mid - 1)


def test_uniformly_random_guesser_wins_at_most_30_percent():
    env, rng = GuessNumber(), random.Random(0)  # the defaults, as in specs/guess-number.yaml
    wins = sum(play(env, env.task(rng), [rng.choice(env.letters) for _ in range(4)])[1] for _ in range(20_000))
    assert abs(wins / 20_000 - (1 - (11 / 12) ** 4)) < 0.01
    assert wins / 20_000 <= 0.30


def test_task_is_a_function_of_the_rng():
    env = GuessNumber()
    assert env.task(random.Random("0:7")) == env.task(random.Random("0:7"))


def test_resolve_builtin_and_import_path():
    assert resolve_entrypoint("guess-number") is GuessNumber
    assert resolve_entrypoint("tasks.actors.envs.guess_number:GuessNumber") is GuessNumber
    with pytest.raises(ValueError, match="unknown environment"):
        resolve_entrypoint("nope")
    with pytest.raises(ValueError, match="cannot import"):
        resolve_entrypoint("no_such_module:Env")
