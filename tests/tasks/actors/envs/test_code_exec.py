import asyncio
import random

import jax
import pytest

from flows.spec import load_spec
from learner.model import init_params
from tasks.actors import sandbox
from tasks.actors.envs import code_exec, resolve_entrypoint
from tasks.actors.envs.code_exec import CodeExec
from tasks.actors.generation import local_generation
from tasks.actors.rollout import GroupRunner

# What a uniformly random policy writes with the spec's tokenizer (specs/code-exec.yaml):
# two tokens, each one of the 14 alphabet characters, nothing (pad, bos) or the end (eos).
RANDOM_TOKENS = list("0123456789+-*!") + ["", "", None]


def play(env, prompt, actions):
    return asyncio.run(episode(env, prompt, actions))


async def episode(env, prompt, actions):
    observations = [env.reset(prompt)]
    for action in actions:
        obs, reward, done, info = await env.step(action)
        observations.append(obs)
        if done:
            return observations, reward, info["success"]
    return observations, 0.0, False


def test_output_of_the_program_is_compared_with_the_target():
    env = CodeExec()
    assert play(env, "target=7", ["3+4"]) == (["7", ""], 1.0, True)
    assert play(env, "target=7", ["5", "2*6", "9-"]) == (["7", "5", "12", "!"], 0.0, False)


def test_errors_limits_and_long_outputs_show_as_bang():
    env = CodeExec(targets=10, attempts=3, limits={"cpu_s": 1, "wall_s": 0.5})
    observations, _, _ = play(env, "target=0", ["-+", "999", "9**9**9"])
    assert observations == ["0", "!", "!", "!"]  # a syntax error, three digits, the CPU limit
    assert play(env, "target=0", ["-3", "0"])[0] == ["0", "-3", ""]


def test_pure_arithmetic_runs_once_per_process(monkeypatch):
    runs = []
    real = sandbox.run_async

    async def counting(code, limits):
        runs.append(code)
        return await real(code, limits)

    monkeypatch.setattr(code_exec.sandbox, "run_async", counting)
    monkeypatch.setattr(code_exec, "_OUTPUTS", {})
    play(CodeExec(), "target=5", ["2+2", "2+2", "4+1"])
    assert runs == ["print(2+2)\n", "print(4+1)\n"]
    # Another environment of the process reuses those outputs; other limits, or a program
    # that is not pure arithmetic (a syntax error here), run again.
    assert play(CodeExec(attempts=4), "target=4", ["4+1", "-!", "-!", "2+2"]) == (["4", "5", "!", "!", ""], 1.0, True)
    assert play(CodeExec(limits={"wall_s": 3.0}), "target=5", ["4+1"])[2]
    assert runs == ["print(2+2)\n", "print(4+1)\n", "print(-!)\n", "print(-!)\n", "print(4+1)\n"]


def test_outputs_kept_are_bounded(monkeypatch):
    monkeypatch.setattr(code_exec, "_OUTPUTS", {})
    monkeypatch.setattr(code_exec, "_OUTPUTS_MAX", 1)
    play(CodeExec(), "target=5", ["2+2", "4+1"])
    assert list(code_exec._OUTPUTS) == [("2+2", CodeExec().limits)]


@pytest.mark.parametrize("kwargs, message", [
    ({"targets": 0}, "targets"), ({"attempts": 0}, "attempts"),
    ({"limits": {"cpu": 1}}, "limits: .*known: cpu_s"), ({"limits": {"wall_s": 0}}, "wall_s must be positive")])
def test_bad_kwargs(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CodeExec(**kwargs)


def test_prompts():
    env = CodeExec(targets=20)
    assert env.task(random.Random("0:5")) == env.task(random.Random("0:5"))
    assert env.reset("target=19") == "19"
    for bad in ("target=20", "target=07", "7"):
        with pytest.raises(ValueError, match="not a code-exec prompt"):
            env.reset(bad)


def test_random_policy_wins_about_6_percent(monkeypatch):
    async def arithmetic(code, limits):  # the sandbox's answer for these programs, in-process
        try:
            return sandbox.Result(f"{eval(code[6:-2] or 'None', {})}\n", "", 0, False, None)
        except SyntaxError:
            return sandbox.Result("", "SyntaxError", 1, False, None)

    monkeypatch.setattr(code_exec.sandbox, "run_async", arithmetic)
    env, rng, episodes = CodeExec(), random.Random(0), 10_000

    async def wins():
        return sum([(await episode(env, env.task(rng), [random_action(rng) for _ in range(3)]))[2]
                    for _ in range(episodes)])

    assert abs(asyncio.run(wins()) / episodes - 0.063) < 0.01


def random_action(rng) -> str:
    first, second = rng.choice(RANDOM_TOKENS), rng.choice(RANDOM_TOKENS)
    return "" if first is None else first + (second or "")


def test_async_step_through_the_group_runner():
    spec = load_spec("specs/code-exec.yaml", ["model.d_model=16", "model.n_layers=1", "model.d_ff=32",
                                              "actors.group_size=4"])
    envs = [resolve_entrypoint(spec.env.entrypoint)(**spec.env.kwargs) for _ in range(spec.actors.group_size)]
    with local_generation(spec.model, spec.actors, jax.device_get(init_params(spec.model, 0)), version=3) as service:
        runner = GroupRunner.build(service, spec.env, spec.actors, spec.model)
        group = asyncio.run(runner.run(0, "target=7", 0, envs))
    assert group.aborted is None and len(group.samples) == spec.actors.group_size
    for sample in group.samples:
        assert sample.success is not None and sample.reward == float(sample.success)
        assert 3 in sample.versions  # tokens the policy wrote, between observations


def test_builtin_name():
    assert resolve_entrypoint("code-exec") is CodeExec
