"""The latency audit's measurements: what acting and learning cost on this hardware.

For one spec it times
- the environment's own `step` (called directly, with random actions from the tokenizer's
  alphabet); `env.latency_s` is not slept here: an actor spends it asleep, so it is added
  to a group's time arithmetically;
- a group played alone, latency off: its compute and turns (the first `warmup` groups,
  which compile the engine, are not counted), its episodes' length, and the share of
  groups the buffer would keep (not aborted, passing the entry filters);
- an actor process at full load: groups per second with `actors.groups_per_worker` groups at once
  through one engine, latency off, in a process pinned to one core as a local cluster's
  worker runs;
- the learner's step on a batch of the played groups (`TrainStep`, the compile timed
  apart), in a process pinned to the learner's cores; building that batch
  (`batch_of_groups`) and copying the weights to the host to publish them.
`flows.audit` turns these into a prediction and a recommendation.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import os
import pickle
import random
import subprocess
import sys
import time
from pathlib import Path

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
from tasks.actors.cluster import ACTOR_ENV
from tasks.actors.rollout import GroupRunner

ROOT = Path(__file__).resolve().parents[1]


@dataclasses.dataclass(frozen=True)
class Measurements:
    """Seconds measured on this machine for one spec (see the module docstring)."""

    env_step_s: tuple[float, ...]  # env.step's own time per call, latency_s excluded
    latency_s: float  # env.latency_s of the spec: slept before every step
    group_compute_s: tuple[float, ...]  # per group played alone: generation and env calls, no latency
    group_turns: tuple[int, ...]  # per group: turns of its longest episode
    episode_tokens: float  # mean tokens of an episode (what a batch packs)
    kept: float  # fraction of groups the buffer keeps (not aborted, passing the filters)
    actor_groups_per_s: float  # one actor process on one core, latency off, actors.groups_per_worker at once
    train_step_s: tuple[float, ...]  # per learner step after the compile, on the learner's cores
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


def measure(spec, *, env_steps: int = 200, groups: int = 8, train_steps: int = 5, actor_seconds: float = 8.0,
            warmup: int = 1, seed: int = 0, cores: tuple[set[int], set[int]] | None = None) -> Measurements:
    """Measures `spec` (a `flows.spec.Spec`) on this machine; `cores` = (learner's, actor's),
    by default the last core for the learner and the first for an actor process."""
    learner_cores, actor_cores = cores or split_cores()
    env_step_s = measure_env(spec, env_steps, seed)
    played = measure_groups(spec, groups, warmup, seed)
    filters = [resolve_filter(name) for name in spec.buffer.filters]
    finished = [g for g, _, _ in played if not g.aborted]
    kept = [g for g in finished if all(f(g) for f in filters)]
    rate = _pinned("actor_rate", actor_cores, spec, seconds=actor_seconds, seed=seed)
    train = _pinned("learner", learner_cores, spec, groups=finished, steps=train_steps, seed=seed)
    lengths = [len(s) for g in finished for s in g.samples] or [spec.model.max_len]
    return Measurements(
        env_step_s=tuple(env_step_s), latency_s=spec.env.latency_s,
        group_compute_s=tuple(s for _, s, _ in played), group_turns=tuple(t for _, _, t in played),
        episode_tokens=float(np.mean(lengths)), kept=len(kept) / len(played), actor_groups_per_s=rate, **train)


def split_cores() -> tuple[set[int], set[int]]:
    """(learner's cores, one actor process's core): the last core, and the first."""
    cores = sorted(os.sched_getaffinity(0))
    return ({cores[-1]}, {cores[0]}) if len(cores) > 1 else (set(cores), set(cores))


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
        runner = GroupRunner.build(service, no_latency, spec.actors, spec.model, seed)
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


def measure_actor_rate(spec, seconds: float, seed: int) -> float:
    """Groups per second of one actor process, latency off, `actors.groups_per_worker` groups
    at once (each replaced by the next prompt as it finishes), after a warm-up that compiles."""
    env_class = resolve_entrypoint(spec.env.entrypoint)
    no_latency = spec.env.model_copy(update={"latency_s": 0.0})
    source = PromptSource(spec.data, env_class, spec.env.kwargs, seed)
    envs = [[env_class(**spec.env.kwargs) for _ in range(spec.actors.group_size)]
            for _ in range(spec.actors.groups_per_worker)]

    async def play(runner, until: float) -> int:
        done = 0

        async def loop(env_set):
            nonlocal done
            while time.perf_counter() < until:
                prompt = source.next()
                await runner.run(prompt.id, prompt.text, 0, env_set)
                done += 1

        await asyncio.gather(*(loop(e) for e in envs))
        return done

    with local_generation(spec.model, spec.actors, jax.device_get(init_params(spec.model, seed))) as service:
        runner = GroupRunner.build(service, no_latency, spec.actors, spec.model, seed)
        compiled, deadline = None, time.perf_counter() + 120
        while service.engine.compiles != compiled and time.perf_counter() < deadline:  # until no shape is new
            compiled = dict(service.engine.compiles)
            asyncio.run(play(runner, time.perf_counter() + 2.0))
        start = time.perf_counter()
        done = asyncio.run(play(runner, start + seconds))
        return done / (time.perf_counter() - start)


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


def _pinned(what: str, cores: set[int], spec, **kwargs):
    """`measure_actor_rate` or `measure_learner` in a process of its own on `cores`, with the
    XLA settings an actor process runs with (its threads are then the cores' only load)."""
    env = {**os.environ, **(ACTOR_ENV if what == "actor_rate" else {}), "PYTHONPATH": str(ROOT)}
    # `taskset` pins every thread the child starts (XLA's pool included); a `preexec_fn`
    # would fork this process, whose JAX threads make forking unsafe.
    command = ["taskset", "-c", ",".join(map(str, sorted(cores))), sys.executable, "-m", "tasks.measure"]
    done = subprocess.run(command, input=pickle.dumps((what, spec, kwargs)), capture_output=True, env=env, cwd=ROOT)
    if done.returncode:
        raise RuntimeError(f"measuring {what} failed: {done.stderr.decode(errors='replace')[-2000:]}")
    return pickle.loads(done.stdout)


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


if __name__ == "__main__":  # `_pinned`'s child: (what, spec, kwargs) on stdin, its result on stdout
    what, spec, kwargs = pickle.loads(sys.stdin.buffer.read())
    result = {"actor_rate": measure_actor_rate, "learner": measure_learner}[what](spec, **kwargs)
    sys.stdout.buffer.write(pickle.dumps(result))
