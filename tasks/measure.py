"""The latency audit's measurements: what acting and learning cost on this hardware.

For one spec it times
- the environment's own `step` (called directly, with random actions from the tokenizer's
  alphabet); `env.latency_s` is not slept here: an actor spends it asleep, so it is added
  to a group's time arithmetically;
- a group's compute and turns: a `GroupRunner` with the spec's model at random init and
  the latency off (the first `warmup` groups, which compile the sampler, are not counted),
  and the share of groups the buffer would keep (not aborted, passing the entry filters);
- the learner's step on a batch of those groups (`TrainStep`, the compile timed apart),
  building that batch (`batch_of_groups`) and copying the weights to the host to publish them.
`flows.audit` turns these into a prediction and a recommendation.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import random
import time

import jax
import numpy as np

from learner.batching import batch_of_groups
from learner.model import init_params
from learner.sharding import make_mesh
from learner.train import TrainStep, init_train_state, params_numpy
from learner.trajectory import OBSERVATION, Group, Sample
from tasks.buffer.prompts import PromptSource
from tasks.actors.envs import resolve_entrypoint
from tasks.buffer.filters import resolve_filter
from tasks.actors.generation import local_generation
from tasks.actors.rollout import GroupRunner


@dataclasses.dataclass(frozen=True)
class Measurements:
    """Seconds measured on this machine for one spec (see the module docstring)."""

    env_step_s: tuple[float, ...]  # env.step's own time per call, latency_s excluded
    latency_s: float  # env.latency_s of the spec: slept before every step
    group_compute_s: tuple[float, ...]  # per group: generation and env calls, no latency
    group_turns: tuple[int, ...]  # per group: turns played (the longest episode's; lockstep)
    kept: float  # fraction of groups the buffer keeps (not aborted, passing the filters)
    train_step_s: tuple[float, ...]  # per learner step after the compile
    compile_s: float  # the first learner step: compile and run
    batch_s: float  # batch_of_groups per step (host, before the step)
    publish_s: float  # weights to host NumPy, once per version

    @property
    def group_s(self) -> np.ndarray:
        """Wall time of each measured group with the spec's latency: compute + turns × latency."""
        return np.asarray(self.group_compute_s) + np.asarray(self.group_turns) * self.latency_s

    @property
    def step_s(self) -> float:
        return float(np.median(self.train_step_s))

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def measure(spec, *, env_steps: int = 200, groups: int = 8, train_steps: int = 5,
            warmup: int = 1, seed: int = 0) -> Measurements:
    """Measures `spec` (a `flows.spec.Spec`; anything with its sections) on this machine."""
    env_step_s = measure_env(spec, env_steps, seed)
    played = measure_groups(spec, groups, warmup, seed)
    filters = [resolve_filter(name) for name in spec.buffer.filters]
    kept = [g for g, _, _ in played if not g.aborted and all(f(g) for f in filters)]
    train = measure_learner(spec, [g for g, _, _ in played if not g.aborted], train_steps, seed)
    return Measurements(
        env_step_s=tuple(env_step_s), latency_s=spec.env.latency_s,
        group_compute_s=tuple(s for _, s, _ in played), group_turns=tuple(t for _, _, t in played),
        kept=len(kept) / len(played), **train)


def measure_env(spec, steps: int, seed: int) -> list[float]:
    """Seconds per `env.step` with random actions, over episodes played to their end."""
    env_class = resolve_entrypoint(spec.env.entrypoint)
    env, rng = env_class(**spec.env.kwargs), random.Random(seed)
    alphabet = _alphabet(spec)
    times: list[float] = []
    while len(times) < steps:
        _call(env.reset, env.task(rng))
        for _ in range(spec.env.max_turns):
            action = "".join(rng.choice(alphabet) for _ in range(spec.actors.max_new_tokens))
            start = time.perf_counter()
            _, _, done, _ = _call(env.step, action)
            times.append(time.perf_counter() - start)
            if done or len(times) >= steps:
                break
    return times


def measure_groups(spec, n: int, warmup: int, seed: int) -> list[tuple[Group, float, int]]:
    """`n` groups played one at a time as an actor plays them (latency off, compiles
    excluded): (group, seconds, turns)."""
    env_class = resolve_entrypoint(spec.env.entrypoint)
    no_latency = spec.env.model_copy(update={"latency_s": 0.0})
    source = PromptSource(spec.data, env_class, spec.env.kwargs, seed)
    envs = [env_class(**spec.env.kwargs) for _ in range(spec.actors.group_size)]
    out = []
    with local_generation(spec.model, spec.actors, jax.device_get(init_params(spec.model, seed))) as service:
        runner = GroupRunner.build(service.generate, no_latency, spec.actors, spec.model, seed)
        for i in range(warmup + n):
            prompt = source.next()
            play = functools.partial(runner.run, prompt.id, prompt.text, 0, envs)
            if i >= warmup:
                # An actor compiles each engine shape once per process; a group that met a
                # new shape would count that compile as its compute. The replay timed below
                # draws the same tokens, so meets the same shapes, all compiled by now.
                asyncio.run(play())
            start = time.perf_counter()
            group = asyncio.run(play())
            seconds = time.perf_counter() - start
            if i >= warmup:
                out.append((group, seconds, _turns(group, spec.env.max_turns)))
    return out


def measure_learner(spec, groups: list[Group], steps: int, seed: int) -> dict:
    """Times the train step on a batch of `batch_groups` groups (cycled from `groups`)."""
    groups = _batch_groups(spec, groups)
    start = time.perf_counter()
    batch = batch_of_groups(groups, spec.learner)
    batch_s = time.perf_counter() - start
    mesh = make_mesh(spec.learner.mesh)
    state = init_train_state(spec.model, spec.learner, seed=seed, mesh=mesh)
    train_step = TrainStep(spec.model, spec.learner, mesh)
    start = time.perf_counter()
    state, _ = train_step(state, batch)  # returns after the step: its metrics are host floats
    compile_s = time.perf_counter() - start
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        state, _ = train_step(state, batch)
        times.append(time.perf_counter() - start)
    start = time.perf_counter()
    params_numpy(state)
    publish_s = time.perf_counter() - start
    return {"train_step_s": tuple(times), "compile_s": compile_s, "batch_s": batch_s, "publish_s": publish_s}


def _batch_groups(spec, groups: list[Group]) -> list[Group]:
    """One batch's groups: the played groups cycled; groups of full-length random episodes
    if none finished (an upper bound: the longest bucket's shape)."""
    n, size, length = spec.learner.batch_groups, spec.actors.group_size, spec.model.max_len
    if groups:
        return [groups[i % len(groups)] for i in range(n)]
    rng = np.random.default_rng(0)
    tokens = rng.integers(3, spec.model.vocab_size, (n, size, length)).astype(np.int32)
    logprobs, versions = np.full(length, -1.0, np.float32), np.zeros(length, np.int32)
    return [Group(i, "", tuple(Sample(t, logprobs, versions, float(j % 2)) for j, t in enumerate(rows)), 0.0, 0.0)
            for i, rows in enumerate(tokens)]


def _turns(group: Group, max_turns: int) -> int:
    """Actions of the group's longest episode; an aborted group has no samples: max_turns."""
    if not group.samples:
        return max_turns
    # Every action starts where an observation token is followed by a generated one.
    return max(int(np.sum(np.diff((s.versions != OBSERVATION).astype(np.int8)) == 1))
               for s in group.samples)


def _alphabet(spec) -> str:
    tokenizer = spec.model.tokenizer
    return tokenizer.alphabet if tokenizer.kind == "char" else "abcdefghijklmnopqrstuvwxyz0123456789 "


def _call(method, *args):
    """A sync env method's result, or an async one's, awaited."""
    if inspect.iscoroutinefunction(method):
        return asyncio.run(method(*args))
    return method(*args)
