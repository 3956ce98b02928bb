"""The in-process floor: its command line's JSON, and episodes laid out as Tandem's actors lay them out."""

import json
import math
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))  # benchmarks are scripts that import their siblings

import floor  # noqa: E402
from flows.spec import load_spec  # noqa: E402
from learner.losses import token_logprobs  # noqa: E402
from learner.model import forward_fn, init_params  # noqa: E402
from learner.trajectory import OBSERVATION  # noqa: E402
from tasks.actors.envs import resolve_entrypoint  # noqa: E402
from tasks.buffer.prompts import PromptSource  # noqa: E402

SPEC = ROOT / "specs" / "guess-number.yaml"


def test_the_floor_prints_a_json_line_per_seed_and_a_summary():
    # One device over both cores, as the floor is meant to run (not conftest's eight).
    command = [sys.executable, str(ROOT / "benchmarks" / "floor.py"), str(SPEC), "--set", "learner.steps=5",
               "--batch-groups", "4", "--seeds", "0", "1", "--target", "0.0", "--window", "3"]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**os.environ, "XLA_FLAGS": ""})
    assert done.returncode == 0, done.stderr[-2000:]
    runs = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [r.get("seed") for r in runs[:2]] == [0, 1]
    for r in runs[:2]:
        assert r["reached"] is True and r["steps"] == 3 and r["target"] == 0.0  # a 3-step window
        assert 0 <= r["seconds"] < 60 and r["compile_s"] > 0
        assert 0 < r["final_entropy"] <= math.log(20) + 1e-3  # at most uniform over the 20 ids
    assert runs[2] == {"summary": True, "target": 0.0, "seeds": [0, 1], "reached": 2, "runs": 2,
                       "median_s": pytest.approx((runs[0]["seconds"] + runs[1]["seconds"]) / 2),
                       "min_s": min(r["seconds"] for r in runs[:2]), "max_s": max(r["seconds"] for r in runs[:2])}


def _replay(sample, prompt, spec, tokenizer):
    """The tokens and versions `tasks.actors.rollout` writes for this sample's actions, and its return."""
    env = resolve_entrypoint(spec.env.entrypoint)(**spec.env.kwargs)
    tokens = tokenizer.start() + tokenizer.observation(env.reset(prompt), first=True)
    versions, reward, info = [OBSERVATION] * len(tokens), 0.0, {}
    while True:
        end = len(tokens)
        while end < len(sample) and sample.versions[end] != OBSERVATION:
            end += 1  # an action: the run of generated tokens that starts here
        action = sample.tokens[len(tokens):end].tolist()
        tokens, versions = tokens + action, versions + [floor.VERSION] * len(action)
        obs, r, done, info = env.step(tokenizer.decode(action))
        reward += r
        if done:
            return tokens, versions, reward, info["success"]
        observed = tokenizer.observation(obs, first=False)
        tokens, versions = tokens + observed, versions + [OBSERVATION] * len(observed)


@pytest.mark.parametrize("overrides", [[], ["actors.max_new_tokens=3", "model.max_len=32", "learner.rows=64"]],
                         ids=["one-token actions", "three-token actions"])
def test_episodes_match_the_actors_layout_and_the_models_logprobs(overrides):
    spec = load_spec(SPEC, overrides)
    parts = floor.build(spec, floor.fixed_learner(spec.learner, spec.actors.group_size, 2))
    env_class = resolve_entrypoint(spec.env.entrypoint)
    source = PromptSource(spec.data, env_class, spec.env.kwargs, seed=0)
    envs = [env_class(**spec.env.kwargs) for _ in range(2 * spec.actors.group_size)]
    params = init_params(spec.model, 0)
    groups = floor.play(parts.sampler, params, jax.random.key(0), envs, [source.next(), source.next()],
                        parts.tokenizer, spec.model, spec.env.max_turns)
    assert groups and all(len(g.samples) == spec.actors.group_size for g in groups)
    forward = jax.jit(forward_fn(spec.model))
    for group in groups:
        for sample in group.samples:
            tokens, versions, reward, success = _replay(sample, group.prompt, spec, parts.tokenizer)
            assert sample.tokens.tolist() == tokens and sample.versions.tolist() == versions
            assert (sample.reward, sample.success) == (reward, success)
            generated = sample.versions != OBSERVATION
            assert np.all(sample.logprobs[~generated] == 0)
            assert np.all(np.isfinite(sample.logprobs)) and np.all(sample.logprobs[generated] <= 0)
            # The behaviour log-probs are the model's own (temperature 1): what the learner
            # computes for the same tokens at version 0, so the first update's ratio is 1.
            row = jnp.asarray(sample.tokens)[None]
            logits = forward(params, row, jnp.arange(len(sample))[None], jnp.ones_like(row))
            recomputed = np.asarray(token_logprobs(logits[:, :-1], row[:, 1:]))[0]
            np.testing.assert_allclose(sample.logprobs[1:][generated[1:]], recomputed[generated[1:]], atol=1e-4)
