"""`tandem audit SPEC`: the latency audit, and the actor pool and pace that reach a good
agent soonest on this machine.

The audit measures the spec here (`tasks.measure`) and models a run as two rates, groups
per second into the buffer and out of it:

    produced = k · min(W·A / T_g, W·R)        consumed = B / (U·s + o)

W actor processes each play A groups at once; a group takes T_g = c + turns × latency
seconds (c: its compute played alone; latency: `env.latency_s`, spent asleep); one
process on one core finishes at most R groups a second however many it plays (its
engine's throughput, measured at A); k is the share the buffer keeps (not aborted, passing
the filters; measured at random init, it changes as the policy learns). The learner takes
B = `learner.batch_groups` groups a batch and trains on it for U = minibatches × epochs
steps of s seconds; o is the host work around them (batching, publishing once per
`sync.interval` steps). Learner busy (as `metrics.jsonl` records it) is then

    async:  busy = U·s / (U·s + o) · min(1, produced / consumed)
    sync:   busy = U·s / (T_sync + U·s + o), T_sync = max(T_g · ceil(B / (k·W·A)), B / (k·W·R))

Throughput is not learning: work beyond what the learner takes within its staleness
budget is waste, and stale tokens learn less (README, "Admission control or exit-time
exclusion"). A token's staleness in optimizer updates is the time from its generation to
its update, times the update rate, plus half a sync interval for the version it waited
for; with `on_sync: retract` a token waits on average for half its group's turns (with
`finish`, for all of them) and then in the buffer:

    staleness ≈ rate · (f · T_g + queue) + (I − 1) / 2,   rate = U · busy / (U·s)

With admission control (`buffer.admission`, budget k versions) no more than (k + 1)·G
groups are open at once (G consumed per version), which caps `produced` and so the rate.

So the audit recommends, for async, the fewest groups at once that keep the learner fed
(more only queue up, staler) but no more than a staleness budget of `STALENESS_BUDGET`
updates admits: in a slow environment feeding a fast learner in full makes every token
tens of updates stale, and learning per step falls faster than the update rate rises. Also
a buffer of one batch, a version every step where publishing is cheap, and `retract`; for
sync, enough groups at once to play a batch in one wave. Where that budget leaves the
learner idle (predicted busy under `IDLE`: the budget, not the learner, sets the pace),
each version carries `BATCH_GROWTH` times the groups under a budget `BUDGET_GROWTH` times as
wide; more data per version costs no staleness (BENCHMARKS.md (j), guess-number at 2 s).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
from pathlib import Path

import numpy as np

from tasks.buffer.intake import groups_per_version

SCHEDULER_OPS_PER_FLUSH = 2  # an actor's bundle of groups and its reports message
SCHEDULER_OPS_LIMIT = 1000  # per second: about where one Dask scheduler's event loop saturates
PUBLISH_SHARE = 0.05  # the most of a step's time that publishing weights should cost
HEADROOM = 1.15  # actors sized to produce this much more than the learner consumes
# The staleness budget async runs are given (`buffer.admission`, in updates), the fastest
# to 90% of those measured on guess-number at 0.5 s per env step (BENCHMARKS.md (j), seed
# 0): a budget of 8 took 199 s (tokens ~3 updates stale), 16 took 159 s (~5), 32 took
# 182 s (~10); fed in full (no budget, tokens ~66 stale) it was at 53% after 150 s.
# Past ~16, learning per step falls faster than the update rate rises.
STALENESS_BUDGET = 16
# Where the budget, not the learner, sets the pace (a slow env: a version a second while a
# step takes tens of ms), a version may carry more groups at no cost in staleness. Measured
# on guess-number at 2 s per env step (BENCHMARKS.md (j); predicted busy 3% at 16 groups):
# 16 groups a batch and a budget of 16 reached 90% in 457-469 s, 64 groups 286-331 s, 64
# groups and a budget of 32 229-245 s. At 0.5 s (predicted busy 13%) 16 groups and 16 stay:
# a budget of 32 there took 182 s against 159 s. IDLE sits between the two cells.
IDLE = 0.06  # predicted async busy below which the batch and the budget grow
BATCH_GROWTH, BUDGET_GROWTH = 4, 2


@dataclasses.dataclass(frozen=True)
class Pool:
    """The actor pool and learner pace a prediction is for."""

    workers: int  # actor processes, one core each
    actors: int  # groups each plays at once
    batch_groups: int
    sync_interval: int
    updates_per_batch: int = 1  # learner.minibatches × learner.epochs
    capacity: int = 16
    retract: bool = True  # actors.on_sync: retract (tokens follow new versions) or not
    admission: int | None = None  # buffer.max_staleness with buffer.admission on, else None


@dataclasses.dataclass(frozen=True)
class Prediction:
    produced: float  # groups/s kept by the buffer
    consumed: float  # groups/s the learner could train on
    busy_async: float
    busy_sync: float
    staleness_updates: float  # mean over trained tokens, async
    staleness_versions: float
    scheduler_ops: float  # per second


def admitted(budget: int, batch_groups: int, sync_interval: int, updates_per_batch: int) -> float:
    """The most groups admission control keeps open with a budget of `budget` versions
    (README, "Admission control"): (budget + 1) versions' worth of what the learner takes."""
    return (budget + 1) * groups_per_version(batch_groups, sync_interval, updates_per_batch)


def predict(m, pool: Pool) -> Prediction:
    """Rates, learner busy and staleness for measurements `m` (`tasks.measure.Measurements`)."""
    group_s, step = float(np.mean(m.group_s)), m.step_s * pool.updates_per_batch
    engine = pool.workers * m.actor_groups_per_s
    at_once = pool.workers * pool.actors
    if pool.admission is not None:  # no more open than the budget lets the learner take in time
        at_once = min(at_once, admitted(pool.admission, pool.batch_groups, pool.sync_interval, pool.updates_per_batch))
    produced = m.kept * min(at_once / group_s, engine)
    overhead = _overhead(m, pool)
    consumed = pool.batch_groups / (step + overhead)
    fed = min(1.0, produced / consumed)
    busy_async = step / (step + overhead) * fed
    waves = math.ceil(pool.batch_groups / max(m.kept * at_once, 1e-9))
    sync_play = max(waves * group_s, pool.batch_groups / max(m.kept * engine, 1e-9))
    rate = pool.updates_per_batch * busy_async / step  # updates per second
    # Groups wait in the buffer: a batch's worth while the learner is fed just in time, the
    # whole buffer and the batch in training when the actors outpace it (and block).
    waiting = max(pool.capacity, pool.batch_groups) + pool.batch_groups if produced > consumed else pool.batch_groups
    queue_s = waiting / max(min(produced, consumed), 1e-9)
    # Under load a group also waits its turns in the engine: A groups at once take A / R seconds each.
    in_flight = (0.5 if pool.retract else 1.0) * max(group_s, at_once / pool.workers / m.actor_groups_per_s)
    staleness = rate * (in_flight + queue_s) + (pool.sync_interval - 1) / 2
    flushes = pool.workers / 0.01  # an actor flushes what finished every 10 ms, when anything did
    return Prediction(produced=produced, consumed=consumed, busy_async=busy_async,
                      busy_sync=step / (sync_play + step + overhead), staleness_updates=staleness,
                      staleness_versions=staleness / pool.sync_interval,
                      scheduler_ops=min(flushes, produced / max(m.kept, 1e-9)) * SCHEDULER_OPS_PER_FLUSH)


@dataclasses.dataclass(frozen=True)
class Recommendation:
    mode: str
    workers: int
    actors: int  # groups each actor process plays at once
    slots: int
    batch_groups: int
    capacity: int
    sync_interval: int
    rows: int | None  # packed rows per batch (None: a row per sample)
    buckets: tuple[int, ...]
    busy: float  # predicted with these settings
    staleness_updates: float  # predicted mean, async (0 in sync mode)
    max_staleness: int | None  # the staleness budget, in versions: admission's and the exit check's
    why: tuple[str, ...]

    @property
    def overrides(self) -> list[str]:
        """The recommendation as `tandem run --set` values."""
        out = [f"learner.mode={self.mode}", f"actors.workers={self.workers}",
               f"actors.groups_per_worker={self.actors}", f"actors.slots={self.slots}",
               f"learner.batch_groups={self.batch_groups}", f"buffer.capacity={self.capacity}",
               f"sync.interval={self.sync_interval}",
               f"learner.buckets=[{','.join(map(str, self.buckets))}]",
               f"learner.rows={'null' if self.rows is None else self.rows}",
               f"buffer.max_staleness={'null' if self.max_staleness is None else self.max_staleness}"]
        if self.mode == "async":
            return out + ["buffer.admission=true", "actors.on_sync=retract"]
        return out + ["buffer.admission=false"]  # sync dispatches each batch at its version: no budget


def recommend(m, spec, mode: str, workers: int) -> Recommendation:
    """The settings that reach a good agent soonest, as the model sees it (module docstring):
    for async, the spec's batch and `STALENESS_BUDGET`, or `BATCH_GROWTH` times the batch
    and `BUDGET_GROWTH` times the budget where the learner would idle (`IDLE`)."""
    batch = spec.learner.batch_groups
    if mode == "sync":
        return _recommend(m, spec, mode, workers, batch, None)
    first = _recommend(m, spec, mode, workers, batch, STALENESS_BUDGET)
    if first.busy >= IDLE:
        return first
    return _recommend(m, spec, mode, workers, BATCH_GROWTH * batch, BUDGET_GROWTH * STALENESS_BUDGET,
                      why=(f"at {batch} groups a batch the learner would be {first.busy:.0%} busy: the budget, "
                           f"not the learner, sets the pace, so each version carries {BATCH_GROWTH}x the groups "
                           f"and the budget is {BUDGET_GROWTH}x (measured: BENCHMARKS.md (j))",))


def _recommend(m, spec, mode: str, workers: int, batch: int, budget: int | None, why: tuple[str, ...] = ()
               ) -> Recommendation:
    """The pool and pace for `batch` groups a batch and a staleness budget of `budget` updates."""
    learner, actors = spec.learner, spec.actors
    rows, buckets = _packing(m, spec, batch)
    m = _packed(m, spec, batch, rows, buckets)
    updates = learner.updates_per_batch
    interval = updates if mode == "sync" else max(1, math.ceil(m.publish_s / (PUBLISH_SHARE * m.step_s)))
    admission = None if budget is None else max(1, math.ceil(budget / interval))  # in versions
    group_s = float(np.mean(m.group_s))
    if mode == "sync":  # a batch in one wave, with room for the groups the filters reject
        per_worker = math.ceil(batch * HEADROOM / max(m.kept, 0.1) / workers)
    else:  # just enough to feed the learner (more only queue up, staler) or to keep the actor
        # cores busy (more only queue on them), and no more than the staleness budget admits:
        # past it, actors would hold groups they may not start
        needed = HEADROOM * batch / (m.step_s * updates + m.batch_s) / max(m.kept, 0.1)
        needed = min(needed, HEADROOM * m.actor_groups_per_s * workers)
        room = HEADROOM * admitted(admission, batch, interval, updates) / max(m.kept, 0.1)
        per_worker = math.ceil(min(needed * group_s, room) / workers)
    # No fewer than the audit measured the engine's throughput with: fewer may not fill it.
    per_worker = max(per_worker, actors.groups_per_worker)
    pool = Pool(workers, per_worker, batch, interval, updates, capacity=batch, retract=mode == "async",
                admission=admission)
    p = predict(m, pool)
    busy = p.busy_async if mode == "async" else p.busy_sync
    staleness = p.staleness_updates if mode == "async" else 0.0
    slots = _slots(per_worker * actors.group_size)
    return Recommendation(mode, workers, per_worker, slots, batch, batch, interval, rows, buckets, busy, staleness,
                          admission, (*why, *_why(m, pool, p, mode, slots)))


def _packed(m, spec, batch: int, rows: int | None, buckets: tuple[int, ...]):
    """The measurements with the train step scaled from the batch measured (the spec's) to
    `batch` at the recommended packing: its time follows the batch's padded size (README:
    about linear in sequence length)."""
    group = spec.actors.group_size
    measured = spec.learner.batch_rows(spec.learner.batch_groups * group) * spec.learner.buckets[0]
    planned = (batch * group if rows is None else rows) * buckets[0]
    return dataclasses.replace(m, train_step_s=tuple(t * planned / measured for t in m.train_step_s))


def _packing(m, spec, batch: int) -> tuple[int | None, tuple[int, ...]]:
    """Rows and buckets that pack `batch` groups' samples with little padding: episodes
    shorter than half a row share rows (the train step's cost follows its padded size)."""
    samples = batch * spec.actors.group_size
    row = 1 << max(0, math.ceil(math.log2(spec.model.max_len)))
    if 1.25 * m.episode_tokens > 0.8 * row:  # packing would save less than a fifth of the slots
        return None, (row,)
    rows = math.ceil(1.25 * samples * m.episode_tokens / (2 * row))
    # A multiple of 8 divides over any mesh of up to 8 batch shards; the larger bucket
    # takes a batch of unusually long episodes.
    return -(-rows // 8) * 8, (2 * row, 4 * row)


def _slots(episodes: int) -> int:
    """Decode slots for `episodes` at once: a power of two, so that an episode keeps its
    warm slot across turns (prefix reuse), within 64..1024."""
    return min(1024, max(64, 1 << max(0, math.ceil(math.log2(episodes)))))


def _why(m, pool: Pool, p: Prediction, mode: str, slots: int) -> tuple[str, ...]:
    group_s = float(np.mean(m.group_s))
    out = [f"a group takes {group_s:.2f} s ({np.mean(m.group_turns):.1f} turns); one actor core finishes "
           f"{m.actor_groups_per_s:.0f} groups/s at most; the learner takes {p.consumed:.1f} groups/s",
           f"{pool.workers} x {pool.actors} groups at once produce {p.produced:.1f} kept groups/s"]
    if mode == "async":
        out.append(f"mean staleness ~{p.staleness_updates:.1f} optimizer updates ({p.staleness_versions:.1f} versions): "
                   "more groups at once would only wait in the buffer, staler")
        if pool.admission is not None and pool.workers * pool.actors * m.kept >= admitted(
                pool.admission, pool.batch_groups, pool.sync_interval, pool.updates_per_batch):
            out.append(f"feeding the learner in full would need more groups open than a budget of {pool.admission} "
                       "versions admits: staler tokens would cost more steps than the faster learner gains")
        if p.produced < p.consumed:
            out.append(f"the actors cannot feed the learner ({p.produced:.1f} kept groups/s of the {p.consumed:.1f} "
                       "it could take): more actor cores (actors.workers, on more machines: actors.cluster) "
                       "would keep it busier; more groups at once on these cores would not")
    else:
        out.append("sync plays each batch with the latest weights: staleness 0, the learner waits for every batch")
    return tuple(out)


def warnings(m, spec, pool: Pool, prediction: Prediction) -> list[str]:
    out = []
    if m.kept == 0:
        out.append("no measured group was kept (aborted or filtered): the learner would starve")
    if prediction.produced > 1.5 * prediction.consumed:
        out.append(f"the actors outpace the learner {prediction.produced / prediction.consumed:.1f}x: "
                   "the buffer stays full, actors block on it, and every group waits in it "
                   f"{(spec.buffer.capacity + 2 * pool.batch_groups) / groups_per_version(pool.batch_groups, pool.sync_interval, pool.updates_per_batch):.1f} versions")
    if prediction.scheduler_ops > SCHEDULER_OPS_LIMIT:
        out.append(f"~{prediction.scheduler_ops:.0f} scheduler ops/s (> {SCHEDULER_OPS_LIMIT}): the Dask "
                   "scheduler, not the actors, will limit throughput")
    return out


def actor_workers(spec) -> int:
    """Actor processes: on a local cluster one per core the learner leaves (it keeps one),
    elsewhere as the spec says."""
    if spec.actors.cluster != "local":
        return spec.actors.workers
    return max(1, len(os.sched_getaffinity(0)) - 1)


def spec_pool(spec) -> Pool:
    """The pool and pace as the spec is written."""
    return Pool(spec.actors.workers, spec.actors.groups_per_worker, spec.learner.batch_groups, spec.sync.interval,
                spec.learner.updates_per_batch, spec.buffer.capacity, retract=spec.actors.on_sync == "retract",
                admission=spec.buffer.max_staleness if spec.buffer.admission else None)


def audit_command(spec, *, mode: str | None, groups: int, train_steps: int, env_steps: int,
                  json_path: Path | None) -> int:
    from tasks.measure import measure

    m = measure(spec, env_steps=env_steps, groups=groups, train_steps=train_steps)
    pool = spec_pool(spec)
    prediction = predict(m, pool)
    mode = mode or spec.learner.mode
    advice = recommend(m, spec, mode, actor_workers(spec))
    found = warnings(m, spec, pool, prediction)
    audit = {"measurements": m.to_json(), "pool": dataclasses.asdict(pool),
             "prediction": dataclasses.asdict(prediction),
             "recommendation": {**dataclasses.asdict(advice), "overrides": advice.overrides}, "warnings": found}
    print(render(spec, m, pool, prediction, advice, found))
    if json_path == Path("-"):
        print("\n--- json\n" + json.dumps(audit))
    elif json_path is not None:
        json_path.write_text(json.dumps(audit, indent=2) + "\n")
    sys.stdout.flush()
    return 0


def render(spec, m, pool: Pool, p: Prediction, r: Recommendation, found: list[str]) -> str:
    ms = lambda xs: f"p50 {np.median(xs) * 1e3:8.1f} ms  p99 {np.percentile(xs, 99) * 1e3:8.1f} ms"  # noqa: E731
    lines = [
        f"audit of {spec.name} on this machine",
        f"  env step (own time)     {ms(m.env_step_s)}   + latency_s {m.latency_s:.3f} s",
        f"  group, played alone     {ms(m.group_compute_s)}   turns {np.mean(m.group_turns):.1f}, "
        f"{m.episode_tokens:.1f} tokens an episode",
        f"  one actor core          {m.actor_groups_per_s:.0f} groups/s "
        f"({spec.actors.groups_per_worker} at once, latency off)",
        f"  groups kept             {m.kept:.0%} (not aborted, passing {list(spec.buffer.filters)})",
        f"  learner step            {ms(m.train_step_s)}   first (compile) {m.compile_s:.1f} s",
        f"  batching {m.batch_s * 1e3:.1f} ms/step, publishing {m.publish_s * 1e3:.1f} ms/version",
        f"as written: {pool.workers} x {pool.actors} groups at once, batch {pool.batch_groups} groups "
        f"x {pool.updates_per_batch} steps, sync.interval {pool.sync_interval}",
        f"  produced {p.produced:.2f} groups/s, learner can consume {p.consumed:.2f} groups/s",
        f"  predicted learner busy: async {p.busy_async:.0%}, sync {p.busy_sync:.0%}; "
        f"async staleness ~{p.staleness_updates:.1f} updates ({p.staleness_versions:.1f} versions)",
        f"recommended for learner.mode {r.mode} (predicted busy {r.busy:.0%}, staleness {r.staleness_updates:.1f} updates):",
        "  " + " ".join(f"--set {o}" for o in r.overrides),
        *[f"  because {w}" for w in r.why],
    ]
    lines += [f"warning: {w}" for w in found]
    return "\n".join(lines)


def _overhead(m, pool: Pool) -> float:
    """Host seconds per batch outside the train steps: batching, and publishing every interval."""
    return m.batch_s + m.publish_s * pool.updates_per_batch / pool.sync_interval
