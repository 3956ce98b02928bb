"""`tandem audit SPEC`: the latency audit and the worker-pool design.

The audit measures the spec on this machine (`tasks.measure.measure`) and models the run
as two rates, groups per second into the buffer and out of it:

    produced = k · min(A / T_g, C / c)      consumed = B / (s + o)

A actors each play a group in T_g = c + turns × latency seconds (c: generation and the
environment's own steps, the CPU part; latency: `env.latency_s`, spent asleep); C cores
run the actors, so they cannot finish more than C / c groups a second; k is the share
of groups the buffer keeps (not aborted, passing the filters; measured at random init,
it changes as the policy learns). The learner takes B = `learner.batch_groups` groups a
batch and trains on it for U = minibatches × epochs steps; s is the time of U steps,
o the host work around them (batching, and publishing the weights once per
`sync.interval` steps). Learner busy (the fraction of wall time in train steps, as
`metrics.jsonl` records it) is then

    async:  busy = s / (s + o) · min(1, produced / consumed)
    sync:   busy = s / (ceil(B / (k · A)) · T_g + s + o)   (a batch is played, then trained)

The model ignores Dask and buffer overheads (see the scheduler warning) and assumes
groups take their mean time; benchmarks/actor_scaling.py checks it against real runs.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path

import numpy as np

from tasks.buffer.intake import groups_per_version, outstanding_bound

# Scheduler round trips per group: prompt put and get, weights version and params look-ups,
# the buffer put and get, the report put (prompts, groups and reports move in batches); a
# group larger than buffer.inline_bytes adds its scatter and the learner's fetch.
SCHEDULER_OPS_PER_GROUP = {"inline": 7, "future": 9}
SCHEDULER_OPS_LIMIT = 1000  # per second: about where one Dask scheduler's event loop saturates
PUBLISH_SHARE = 0.05  # the most of a step's time that publishing weights should cost


@dataclasses.dataclass(frozen=True)
class Pool:
    """The actor pool and learner pace a prediction is for."""

    actors: int
    actor_cores: float
    batch_groups: int
    sync_interval: int
    updates_per_batch: int = 1  # learner.minibatches × learner.epochs
    inline: bool = True  # groups travel inside the buffer's queue (buffer.inline_bytes)


@dataclasses.dataclass(frozen=True)
class Prediction:
    produced: float  # groups/s kept by the buffer
    consumed: float  # groups/s the learner could train on
    busy_async: float
    busy_sync: float
    groups_per_s_async: float  # trained
    groups_per_s_sync: float
    scheduler_ops: float  # per second


def predict(m, pool: Pool) -> Prediction:
    """Rates and learner busy for measurements `m` (`tasks.measure.Measurements`) and `pool`."""
    group_s, compute_s = float(np.mean(m.group_s)), float(np.mean(m.group_compute_s))
    raw = min(pool.actors / group_s, pool.actor_cores / compute_s)  # groups finished per second
    produced = m.kept * raw
    step, overhead = m.step_s * pool.updates_per_batch, _overhead(m, pool)
    consumed = pool.batch_groups / (step + overhead)
    busy_async = step / (step + overhead) * min(1.0, produced / consumed)
    waves = math.ceil(pool.batch_groups / max(m.kept * pool.actors, 1e-9))
    sync_step = waves * group_s + step + overhead
    return Prediction(produced=produced, consumed=consumed, busy_async=busy_async,
                      busy_sync=step / sync_step, groups_per_s_async=min(produced, consumed),
                      groups_per_s_sync=pool.batch_groups / sync_step,
                      scheduler_ops=SCHEDULER_OPS_PER_GROUP["inline" if pool.inline else "future"] * raw)


@dataclasses.dataclass(frozen=True)
class Recommendation:
    actors: int
    actor_cores: int  # cores the actors need to keep up
    capacity: int
    sync_interval: int
    max_staleness: float  # versions a group can age, dispatch to take (the outstanding bound)
    busy: float  # predicted with these settings


def recommend(m, batch_groups: int, target_busy: float, updates_per_batch: int = 1) -> Recommendation:
    """The smallest pool that keeps the learner `target_busy`, with its buffer and sync interval."""
    interval = max(1, math.ceil(m.publish_s / (PUBLISH_SHARE * m.step_s)))
    needed = target_busy * batch_groups / (m.step_s * updates_per_batch)  # kept groups/s
    finished = needed / max(m.kept, 1e-9)
    actors = max(1, math.ceil(finished * float(np.mean(m.group_s))))
    cores = max(1, math.ceil(finished * float(np.mean(m.group_compute_s))))
    # One batch prefetched while the learner trains on another covers a step's jitter;
    # more only adds staleness whenever the actors outpace the learner.
    capacity = 2 * batch_groups
    busy = predict(m, Pool(actors, cores, batch_groups, interval, updates_per_batch)).busy_async
    staleness = outstanding_bound(capacity, actors, batch_groups) / groups_per_version(batch_groups, interval, updates_per_batch)
    return Recommendation(actors, cores, capacity, interval, staleness, busy)


def warnings(m, spec, pool: Pool, prediction: Prediction, target_busy: float) -> list[str]:
    out = []
    train = m.step_s * pool.updates_per_batch
    cap = train / (train + _overhead(m, pool))
    if cap < target_busy:
        out.append(f"host work around each batch ({_overhead(m, pool) * 1e3:.0f} ms) caps "
                   f"learner busy at {cap:.0%}: raise sync.interval or the batch")
    if m.kept == 0:
        out.append("no measured group was kept (aborted or filtered): the learner would starve")
    if spec.actors.cluster == "local" and spec.actors.n_actors > spec.actors.workers:
        out.append(f"actors.actors ({spec.actors.n_actors}) > actors.workers ({spec.actors.workers}): a "
                   "local worker runs one actor at a time, so the extra actors never start")
    if prediction.produced > 1.5 * prediction.consumed:
        out.append(f"the actors outpace the learner {prediction.produced / prediction.consumed:.1f}x: "
                   "the buffer stays full, actors block on it, and every group waits "
                   f"{spec.buffer.capacity / groups_per_version(pool.batch_groups, pool.sync_interval, pool.updates_per_batch):.1f} "
                   "versions in it")
    if prediction.scheduler_ops > SCHEDULER_OPS_LIMIT:
        out.append(f"~{prediction.scheduler_ops:.0f} scheduler ops/s (> {SCHEDULER_OPS_LIMIT}): the Dask "
                   "scheduler, not the actors, will limit throughput; use larger groups or fewer, slower actors")
    return out


def spec_pool(spec, actor_cores: float | None = None) -> Pool:
    """The pool as the spec is written: a local cluster runs at most one actor per worker."""
    actors = spec.actors.n_actors
    if spec.actors.cluster == "local":
        actors = min(actors, spec.actors.workers)
    cores = actor_cores if actor_cores is not None else min(actors, os.cpu_count() or 1)
    # At most: tokens (int32), log-probs (float32) and versions (int32) of max_len each.
    group_bytes = spec.actors.group_size * spec.model.max_len * 12
    return Pool(actors, cores, spec.learner.batch_groups, spec.sync.interval, spec.learner.updates_per_batch,
                inline=group_bytes <= spec.buffer.inline_bytes)


def audit_command(spec, *, target_busy: float, groups: int, train_steps: int, env_steps: int,
                  actor_cores: float | None, json_path: Path | None) -> int:
    from tasks.measure import measure

    m = measure(spec, env_steps=env_steps, groups=groups, train_steps=train_steps)
    pool = spec_pool(spec, actor_cores)
    prediction = predict(m, pool)
    advice = recommend(m, spec.learner.batch_groups, target_busy, spec.learner.updates_per_batch)
    found = warnings(m, spec, pool, prediction, target_busy)
    print(render(spec, m, pool, prediction, advice, target_busy, found))
    if json_path is not None:
        json_path.write_text(json.dumps({
            "measurements": m.to_json(), "pool": dataclasses.asdict(pool),
            "prediction": dataclasses.asdict(prediction), "recommendation": dataclasses.asdict(advice),
            "target_busy": target_busy, "warnings": found}, indent=2) + "\n")
    return 0


def render(spec, m, pool: Pool, p: Prediction, r: Recommendation, target_busy: float,
           found: list[str]) -> str:
    ms = lambda xs: f"p50 {np.median(xs) * 1e3:8.1f} ms  p99 {np.percentile(xs, 99) * 1e3:8.1f} ms"  # noqa: E731
    mode = spec.learner.mode
    lines = [
        f"audit of {spec.name} (learner.mode {mode}) on this machine",
        f"  env step (own time)     {ms(m.env_step_s)}   + latency_s {m.latency_s:.3f} s",
        f"  group, compute only     {ms(m.group_compute_s)}   turns {np.mean(m.group_turns):.1f}",
        f"  group, with latency     {ms(m.group_s)}",
        f"  groups kept             {m.kept:.0%} (not aborted, passing {list(spec.buffer.filters)})",
        f"  learner step            {ms(m.train_step_s)}   first (compile) {m.compile_s:.1f} s",
        f"  batching {m.batch_s * 1e3:.1f} ms/step, publishing {m.publish_s * 1e3:.1f} ms/version",
        f"as written: {pool.actors} actors on {pool.actor_cores:g} cores, batch {pool.batch_groups} groups "
        f"x {pool.updates_per_batch} steps, sync.interval {pool.sync_interval}",
        f"  produced {p.produced:.2f} groups/s, learner can consume {p.consumed:.2f} groups/s",
        f"  predicted learner busy: {p.busy_async if mode == 'async' else p.busy_sync:.0%} "
        f"(async {p.busy_async:.0%}, sync {p.busy_sync:.0%}); trained groups/s "
        f"async {p.groups_per_s_async:.2f}, sync {p.groups_per_s_sync:.2f}",
        f"recommended for learner busy {target_busy:.0%}:",
        f"  actors.actors {r.actors} (on at least {r.actor_cores} cores; a local cluster needs "
        f"actors.workers {r.actors}), buffer.capacity {r.capacity}, sync.interval {r.sync_interval}",
        f"  predicted busy {r.busy:.0%}; a group is at most ~{r.max_staleness:.1f} versions stale when taken",
    ]
    lines += [f"warning: {w}" for w in found]
    return "\n".join(lines)


def _overhead(m, pool: Pool) -> float:
    """Host seconds per batch outside the train steps: batching, and publishing every interval."""
    return m.batch_s + m.publish_s * pool.updates_per_batch / pool.sync_interval
