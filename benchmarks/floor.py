"""The tight floor of "wall-clock time to a good agent": GRPO in one process, one jitted call per turn.

The same model, tokenizer, loss, optimizer and train step as `tandem run` of the spec
(`learner.train.TrainStep` on batches from `learner.batching.batch_of_groups`), the same
environment class, group size, groups per step, max_turns, max_new_tokens, sampling
settings and entry filters, so whatever the spec's `learner.loss` and `optimizer` carry
applies here too. What it leaves out is everything between them, which is why it is the
floor: no Dask, no Prefect, no buffer, no generation service and no per-episode
coroutines. A step plays all of its `batch_groups * group_size` episodes in lockstep: each
turn, ONE jitted call feeds every episode's new tokens to the model's KV cache
(`learner.model.extend_fn`) and samples every episode's action; then the environments step
in plain Python, and finished episodes are masked. Episodes are written as Tandem's actors
write them (`tasks.actors.rollout`: observation tokens with version -1 and log-prob 0,
generated tokens with their behaviour log-prob), all at version 0 (on-policy). A group
with an aborted episode (context window full, max_turns reached, environment error) is
dropped, as the actors drop it; groups the spec's `buffer.filters` reject are not trained
on, and a step plays more batches until `batch_groups` groups passed, as Tandem's learner
waits for them (`--no-refill`: train on the groups of one batch that passed, however few).

Shapes are fixed: the sampler compiles once per width of the tokens a turn adds (padded to
a power of two; guess-number only ever adds 2), the train step once per bucket (always
`learner.rows` rows). Each compile is timed apart, off the clock, and reported as
`compile_s`. Time to target is counted as `benchmarks/single_process.py` and `tandem run`
count it: from the end of the first step to the step where the mean success of the last
`--window` steps reaches `--target`.

The loop runs on one device: on CPU that device uses every core, so run it with XLA_FLAGS
empty (not the tests' eight virtual devices). Usage:

    XLA_FLAGS= python benchmarks/floor.py specs/guess-number.yaml [--set path=value ...]
        [--seeds 0 1 2] [--target 0.9] [--window 20] [--seconds 300] [--batch-groups N]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import inspect
import json
import math
import statistics
import time
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from flows.spec import load_spec
from learner.batching import batch_of_groups, empty_batch
from learner.chat import ChatTokenizer, make_tokenizer
from learner.config import LearnerConfig, ModelConfig
from learner.model import KVCache, extend_fn, init_cache
from learner.sampling import SamplingParams, sampling_logprobs
from learner.sharding import make_mesh
from learner.train import TrainStep, init_train_state
from learner.trajectory import OBSERVATION, Group, Sample
from tasks.actors.envs import resolve_entrypoint
from tasks.buffer.filters import resolve_filter
from tasks.buffer.prompts import PromptSource
from tasks.config import ActorsConfig

VERSION = 0  # every token is drawn by the weights being trained: on-policy
# (params, pending [B, T], starts [B], counts [B], cache, key) -> (new [B, N], logprobs [B, N], drawn [B], cache)
Decode = Callable[..., tuple[jax.Array, jax.Array, jax.Array, KVCache]]


def make_decode(model: ModelConfig, actors: ActorsConfig, stop_ids: tuple[int, ...]) -> Decode:
    """The sampler: one jitted call draws every row's action, over a KV cache (`learner.model.extend_fn`).

    `pending` holds, right-padded, the `counts` tokens of each row the cache has not seen
    yet, which sit at positions `starts`...; a row with count 0 is not playing. The call
    prefills them, then draws up to N = `max_new_tokens` tokens a row, a row stopping
    after a stop id (kept, as the engine keeps it) or when its context fills the cache.
    `logprobs` are those of the distribution each token was drawn from
    (`learner.sampling`): the behaviour policy the loss corrects for. Compiles once per
    pending width T (the caller pads T to a power of two).
    """
    extend = extend_fn(model)
    sampling = SamplingParams(actors.temperature, actors.top_k, actors.top_p)
    is_stop = jnp.asarray(np.isin(np.arange(model.vocab_size), stop_ids))
    max_new = actors.max_new_tokens

    def draw(i, key, logits, lengths, open_, new, logps):
        """Token i of every open row, from its next-token logits; other rows record nothing."""
        logp = sampling_logprobs(logits, sampling)
        drawn = jax.random.categorical(jax.random.fold_in(key, i), logp)
        new = new.at[:, i].set(jnp.where(open_, drawn, 0))
        logps = logps.at[:, i].set(jnp.where(open_, jnp.take_along_axis(logp, drawn[:, None], 1)[:, 0], 0.0))
        return drawn, lengths + open_, open_ & ~is_stop[drawn], new, logps

    @functools.partial(jax.jit, donate_argnums=4)
    def decode(params, pending_bt, starts_b, counts_b, cache, key):
        rows, width = pending_bt.shape[0], cache[0].length
        positions = starts_b[:, None] + jnp.arange(pending_bt.shape[1])
        logits, cache = extend(params, pending_bt, positions, cache, jnp.maximum(counts_b - 1, 0))
        lengths, wrote = starts_b + counts_b, counts_b > 0
        new, logps = jnp.zeros((rows, max_new), jnp.int32), jnp.zeros((rows, max_new), jnp.float32)
        drawn, lengths, open_, new, logps = draw(0, key, logits, lengths, wrote, new, logps)

        def next_token(i, carry):
            drawn, wrote, lengths, open_, cache, new, logps = carry
            # The token just drawn goes in at its position; a row that recorded none writes at
            # `width`, which the cache drops (`Attention.extend`).
            at = jnp.where(wrote, lengths - 1, width)[:, None]
            logits, cache = extend(params, drawn[:, None], at, cache, jnp.zeros(rows, jnp.int32))
            wrote = open_ & (lengths < width)
            drawn, lengths, open_, new, logps = draw(i, key, logits, lengths, wrote, new, logps)
            return drawn, wrote, lengths, open_, cache, new, logps

        carry = jax.lax.fori_loop(1, max_new, next_token, (drawn, wrote, lengths, open_, cache, new, logps))
        lengths, cache, new, logps = carry[2], carry[4], carry[5], carry[6]
        return new, logps, lengths - starts_b - counts_b, cache

    return decode


class Sampler:
    """`make_decode`'s sampler, compiled for a new pending width before it is used, the
    seconds spent compiling added up so the run can keep them off its clock."""

    def __init__(self, model: ModelConfig, actors: ActorsConfig, stop_ids: tuple[int, ...]):
        self.decode, self.model = make_decode(model, actors, stop_ids), model
        self.widths: set[int] = set()
        self.compile_s = 0.0

    def __call__(self, params, tokens, starts, counts, cache, key):
        if tokens.shape[1] not in self.widths:
            began = time.perf_counter()
            # Twice: a fresh cache and one the sampler returned differ in placement, and each compiles.
            scratch = init_cache(self.model, tokens.shape[0], self.model.max_len)
            scratch = self.decode(params, tokens, starts, counts, scratch, key)[3]
            jax.block_until_ready(self.decode(params, tokens, starts, counts, scratch, key))
            self.widths.add(tokens.shape[1])
            self.compile_s += time.perf_counter() - began
        return self.decode(params, tokens, starts, counts, cache, key)


@dataclasses.dataclass
class Episodes:
    """A step's episodes as [B, W] arrays, written the way `tasks.actors.rollout._Episode` writes one."""

    tokens: np.ndarray
    logprobs: np.ndarray
    versions: np.ndarray
    lengths: np.ndarray
    rewards: np.ndarray
    success: list  # bool | None: the environment's last info["success"]
    done: np.ndarray
    aborted: np.ndarray

    @classmethod
    def empty(cls, n: int, window: int) -> "Episodes":
        return cls(np.zeros((n, window), np.int32), np.zeros((n, window), np.float32),
                   np.full((n, window), OBSERVATION, np.int32), np.zeros(n, np.int32),
                   np.zeros(n, np.float32), [None] * n, np.zeros(n, bool), np.zeros(n, bool))

    @property
    def live(self) -> np.ndarray:
        return ~(self.done | self.aborted)

    def observe(self, row: int, ids: list[int]) -> None:
        """Appends environment tokens; a context that fills the window aborts the episode,
        as `GroupRunner._act` aborts it before its next action."""
        start, window = self.lengths[row], self.tokens.shape[1]
        ids = ids[: window - start]
        self.tokens[row, start:start + len(ids)] = ids
        self.lengths[row] = start + len(ids)
        self.aborted[row] |= self.lengths[row] >= window

    def act(self, row: int, ids: np.ndarray, logprobs: np.ndarray) -> None:
        span = slice(self.lengths[row], self.lengths[row] + len(ids))
        self.tokens[row, span], self.logprobs[row, span], self.versions[row, span] = ids, logprobs, VERSION
        self.lengths[row] += len(ids)

    def sample(self, row: int) -> Sample:
        n = self.lengths[row]
        return Sample(self.tokens[row, :n].copy(), self.logprobs[row, :n].copy(), self.versions[row, :n].copy(),
                      float(self.rewards[row]), self.success[row])


_LOOP = asyncio.new_event_loop()  # runs the `async def` environment calls (code-exec's step)


def call_all(calls: list[tuple[Callable, Any]]) -> list:
    """Each `method(arg)`'s result, or the exception it raised; awaitables awaited together."""
    results = []
    for method, arg in calls:
        try:
            results.append(method(arg))
        except Exception as e:  # an environment's failure aborts its episode's group, as in Tandem
            results.append(e)
    waiting = [i for i, r in enumerate(results) if inspect.isawaitable(r)]
    if waiting:
        awaited = _LOOP.run_until_complete(asyncio.gather(*(results[i] for i in waiting), return_exceptions=True))
        for i, result in zip(waiting, awaited):
            results[i] = result
    return results


def _observation(tokenizer: ChatTokenizer, obs, *, first: bool) -> list[int] | None:
    """The observation's ids, or None where the actors would abort (not text, or not encodable)."""
    if not isinstance(obs, str):
        return None
    try:
        return tokenizer.observation(obs, first=first)
    except ValueError:
        return None


def _start(episodes: Episodes, row: int, obs, tokenizer: ChatTokenizer) -> None:
    ids = _observation(tokenizer, obs, first=True)
    if ids is None:
        episodes.aborted[row] = True
    else:
        episodes.observe(row, tokenizer.start() + ids)


def _after_step(episodes: Episodes, row: int, result, tokenizer: ChatTokenizer) -> None:
    """Records one `env.step` result as `GroupRunner._turns` does: reward, success, then the next
    observation; a result the actors would refuse (`GroupRunner._step`) aborts the episode."""
    valid = isinstance(result, tuple) and len(result) == 4 and isinstance(result[3], dict)
    if not valid or isinstance(result[1], bool) or not isinstance(result[1], (int, float)):
        episodes.aborted[row] = True
        return
    obs, reward, done, info = result
    episodes.rewards[row] += float(reward)
    if "success" in info:
        episodes.success[row] = bool(info["success"])
    if done:
        episodes.done[row] = True
        return
    ids = _observation(tokenizer, obs, first=False)
    if ids is None:
        episodes.aborted[row] = True
    else:
        episodes.observe(row, ids)


def pending(episodes: Episodes, fed: np.ndarray, live: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The tokens of each live row the cache has not seen (from position `fed`), right-padded
    to a power-of-two width so the sampler compiles for few shapes; and their counts."""
    counts = np.where(live, episodes.lengths - fed, 0).astype(np.int32)
    width = 1 << (int(counts.max()) - 1).bit_length()
    columns = np.minimum(fed[:, None] + np.arange(width), episodes.tokens.shape[1] - 1)
    tokens = np.take_along_axis(episodes.tokens, columns, axis=1) * (np.arange(width) < counts[:, None])
    return tokens.astype(np.int32), counts


def play(sampler: Sampler, params, key: jax.Array, envs: list, prompts: list, tokenizer: ChatTokenizer,
         model: ModelConfig, max_turns: int) -> list[Group]:
    """Plays each prompt in `len(envs) // len(prompts)` environments, every episode in lockstep.

    Returns the groups whose episodes all finished (an aborted one drops its group).
    """
    started, size = time.time(), len(envs) // len(prompts)
    episodes = Episodes.empty(len(envs), model.max_len)
    cache, fed = init_cache(model, len(envs), model.max_len), np.zeros(len(envs), np.int32)
    texts = [p.text for p in prompts for _ in range(size)]
    for row, obs in enumerate(call_all([(env.reset, text) for env, text in zip(envs, texts)])):
        _start(episodes, row, obs, tokenizer)
    for turn in range(max_turns):
        live = np.flatnonzero(episodes.live)
        if not live.size:
            break
        tokens, counts = pending(episodes, fed, episodes.live)
        new, logps, drawn, cache = sampler(params, tokens, fed, counts, cache, jax.random.fold_in(key, turn))
        new, logps, drawn = jax.device_get((new, logps, drawn))
        # The cache holds the context up to the action; the action is fed with the next observation.
        fed = episodes.lengths.copy()
        for row in live:
            episodes.act(row, new[row, :drawn[row]], logps[row, :drawn[row]])
        results = call_all([(envs[row].step, tokenizer.decode(new[row, :drawn[row]])) for row in live])
        for row, result in zip(live, results):
            _after_step(episodes, row, result, tokenizer)
    episodes.aborted |= ~episodes.done  # max_turns reached without finishing: the actors abort it too
    return [Group(p.id, p.text, tuple(episodes.sample(r) for r in rows), started, time.time(), attempt=p.attempt)
            for p, rows in zip(prompts, np.arange(len(envs)).reshape(len(prompts), size))
            if not episodes.aborted[rows].any()]


class Parts(NamedTuple):
    """What every seed of a process shares, built (and compiled) once."""

    mesh: Any
    train_step: TrainStep
    sampler: Sampler
    tokenizer: ChatTokenizer
    compiled: set  # bucket lengths the train step has been compiled for


def build(spec, learner: LearnerConfig) -> Parts:
    tokenizer = make_tokenizer(spec.model)
    mesh = make_mesh(spec.learner.mesh, jax.devices()[:1])
    return Parts(mesh, TrainStep(spec.model, learner, mesh), Sampler(spec.model, spec.actors, tokenizer.stop_ids),
                 tokenizer, set())


def compile_bucket(parts: Parts, state, shape: tuple[int, int]) -> float:
    """Seconds to compile the train step for a batch shape, if not yet done: an update of a
    scratch copy of the state on an all-padding batch, so the clock of the run never sees it."""
    if shape[1] in parts.compiled:
        return 0.0
    began = time.perf_counter()
    parts.train_step(jax.tree.map(jnp.copy, state), empty_batch(*shape))
    parts.compiled.add(shape[1])
    return time.perf_counter() - began


def fixed_learner(learner: LearnerConfig, group_size: int, batch_groups: int | None) -> LearnerConfig:
    """The spec's learner with `batch_groups` groups a step, its rows scaled alike.

    Rows are always fixed (a full batch's samples if the spec sets none), so a step that
    trains on fewer groups after filtering packs into the same shape and never recompiles.
    """
    groups = batch_groups or learner.batch_groups
    if learner.rows is None:
        rows = groups * group_size
    else:
        rows = math.ceil(learner.rows * groups / learner.batch_groups / learner.minibatches) * learner.minibatches
    return learner.model_copy(update={"batch_groups": groups, "rows": rows})


class Settings(NamedTuple):
    """When a run stops, and whether a step refills its batch (see `collect`)."""

    target: float = 0.9
    window: int = 20  # steps averaged for the target
    budget_s: float = 300.0  # seconds after the first step
    refill: bool = True


def collect(parts: Parts, params, spec, learner: LearnerConfig, envs: list, source: PromptSource, filters: list,
            key: jax.Array, refill: bool) -> tuple[list[Group], list[Group]]:
    """(groups to train on, every group played): a batch of `batch_groups` prompts, then with
    `refill` more such batches while fewer than `batch_groups` groups passed the entry checks,
    up to `learner.max_gen_batches` batches in all, as Tandem's learner waits for a full batch
    of groups that passed (`benchmarks/single_process.py` refills alike). Every batch played
    has the same shape; groups beyond a full batch are dropped, so every group is on-policy."""
    kept, played = [], []
    batches = (learner.max_gen_batches or 16) if refill else 1
    for batch in range(batches):
        prompts = [source.next() for _ in range(learner.batch_groups)]
        groups = play(parts.sampler, params, jax.random.fold_in(key, batch), envs, prompts, parts.tokenizer,
                      spec.model, spec.env.max_turns)
        played += groups
        # A non-finite return is excluded at the buffer's entry as `invalid`, before the filters.
        kept += [g for g in groups if np.isfinite(g.rewards).all() and all(f(g) for f in filters)]
        if len(kept) >= learner.batch_groups:
            break
    return kept[:learner.batch_groups], played


def one_step(parts: Parts, state, learner: LearnerConfig, spec, envs: list, source: PromptSource, filters: list,
             key: jax.Array, refill: bool):
    """Plays, then trains on the groups that passed; (state, groups played, entropy or None
    if nothing was trained, seconds spent compiling)."""
    compiled_before = parts.sampler.compile_s
    kept, played = collect(parts, state.params, spec, learner, envs, source, filters, key, refill)
    compiling, entropy = parts.sampler.compile_s - compiled_before, None
    if kept:
        batch = batch_of_groups(kept, learner)
        compiling += compile_bucket(parts, state, batch.shape)
        for state, metrics in parts.train_step.updates(state, batch):
            entropy = metrics["entropy"]
    return state, played, entropy, compiling


def run(spec, learner: LearnerConfig, parts: Parts, settings: Settings) -> dict:
    """One seed of the floor: GRPO steps until the windowed success reaches `settings.target`.

    `compile_s` is the state's initialisation and every XLA compile of the run (the first
    seed of a process pays them; later ones reuse its compiled code but for the state's
    initialisation, which `init_train_state` compiles anew each call), kept off the clock.
    """
    env_class = resolve_entrypoint(spec.env.entrypoint)
    envs = [env_class(**spec.env.kwargs) for _ in range(learner.batch_groups * spec.actors.group_size)]
    source = PromptSource(spec.data, env_class, spec.env.kwargs, spec.seed)
    filters = [resolve_filter(f) for f in spec.buffer.filters]
    began = time.perf_counter()
    state = init_train_state(spec.model, learner, seed=spec.seed, mesh=parts.mesh)
    compile_s, paused = time.perf_counter() - began, 0.0
    key, entropy, successes, start = jax.random.key(spec.seed), None, [], None
    result = {"seed": spec.seed, "target": settings.target, "reached": False, "seconds": None, "steps": 0}
    for step in range(1, learner.steps + 1):
        state, groups, trained, compiling = one_step(parts, state, learner, spec, envs, source, filters,
                                                     jax.random.fold_in(key, step), settings.refill)
        entropy, compile_s = trained if trained is not None else entropy, compile_s + compiling
        paused += compiling if start else 0.0
        start = start or time.perf_counter()  # from the end of the first step, as `tandem run` counts
        elapsed = time.perf_counter() - start - paused
        outcomes = [s.success for g in groups for s in g.samples if s.success is not None]
        successes.append(float(np.mean(outcomes)) if outcomes else 0.0)
        recent = float(np.mean(successes[-settings.window:]))
        result["steps"] = step
        if step % 10 == 0:
            print(f"step {step} t={elapsed:.1f}s success(last {settings.window}) {recent:.2f} "
                  f"entropy {entropy or 0:.2f}", flush=True)
        if len(successes) >= settings.window and recent >= settings.target:
            result.update(reached=True, seconds=round(elapsed, 2))
            break
        if elapsed > settings.budget_s:
            break
    ms_per_step = 1000 * elapsed / max(result["steps"] - 1, 1)
    return {**result, "final_entropy": entropy, "compile_s": round(compile_s, 2), "ms_per_step": round(ms_per_step, 1)}


def summary(results: list[dict]) -> dict:
    """Seeds that reached the target, and the median and range of their seconds."""
    seconds = [r["seconds"] for r in results if r["reached"]]
    return {"summary": True, "target": results[0]["target"], "seeds": [r["seed"] for r in results],
            "reached": len(seconds), "runs": len(results),
            "median_s": statistics.median(seconds) if seconds else None,
            "min_s": min(seconds, default=None), "max_s": max(seconds, default=None)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="path=value, as `tandem run`")
    parser.add_argument("--seeds", type=int, nargs="+", help="seeds run in turn (default: the spec's)")
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--window", type=int, default=20, help="steps averaged for the target")
    parser.add_argument("--seconds", type=float, default=300.0, help="budget after the first step")
    parser.add_argument("--no-refill", dest="refill", action="store_false",
                        help="train each step on the groups of one batch that passed, however few (see `collect`)")
    parser.add_argument("--batch-groups", type=int,
                        help="groups a step (default: learner.batch_groups; learner.rows scales alike)")
    args = parser.parse_args()
    spec = load_spec(args.spec, args.overrides)
    learner = fixed_learner(spec.learner, spec.actors.group_size, args.batch_groups)
    parts = build(spec, learner)
    settings = Settings(args.target, args.window, args.seconds, args.refill)
    results = []
    for seed in args.seeds or [spec.seed]:
        results.append(run(spec.model_copy(update={"seed": seed}), learner, parts, settings))
        print(json.dumps(results[-1]), flush=True)
    if len(results) > 1:
        print(json.dumps(summary(results)), flush=True)


if __name__ == "__main__":
    main()
