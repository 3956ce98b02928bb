"""One group: `group_size` multi-turn episodes of one prompt, played in lockstep.

Each turn the policy writes an action for every running episode in one batched
generation, then all their environment steps run concurrently (a slow tool call
does not serialise the group). Every generated token records its log-prob and the
version of the weights that produced it; observation tokens record version -1.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import random
import time

import jax
import numpy as np

from learner.chat import ChatTokenizer, make_tokenizer
from learner.config import ModelConfig
from learner.sampling import Refresh, Sampler
from learner.trajectory import OBSERVATION, Group, Sample
from tasks.config import ActorsConfig, EnvConfig


class EpisodeAborted(Exception):
    """The group cannot be completed; its message is the reason recorded for it."""


@dataclasses.dataclass
class _Episode:
    env: object
    tokens: list[int]
    logprobs: list[float]
    versions: list[int]
    reward: float = 0.0
    done: bool = False
    success: bool | None = None
    action_start: int = 0  # index of the first token of the latest action

    def observe(self, ids: list[int]) -> None:
        self.tokens += ids
        self.logprobs += [0.0] * len(ids)
        self.versions += [OBSERVATION] * len(ids)


async def _call(method, *args):
    """Runs a sync env method in a thread, or awaits an async one."""
    if inspect.iscoroutinefunction(method):
        return await method(*args)
    return await asyncio.to_thread(method, *args)


@dataclasses.dataclass
class _Policy:
    """The weights a group is being played with, and when they were last checked."""

    params: object
    version: int
    refresh: Refresh | None
    since_check: int = 0  # tokens decoded since the published version was last read

    def due(self, every: int) -> bool:
        return self.refresh is not None and self.since_check >= every

    def check(self, on_sync: str) -> None:
        latest, params = self.refresh()
        self.since_check = 0
        if latest == self.version:
            return
        if on_sync == "abort":
            raise EpisodeAborted(f"version {latest} published mid-episode (on_sync: abort)")
        self.version, self.params = latest, params


@dataclasses.dataclass
class GroupRunner:
    """Plays groups with one actor's environments, sampler and configuration."""

    envs: list
    sampler: Sampler
    tokenizer: ChatTokenizer
    env_config: EnvConfig
    actors_config: ActorsConfig
    _rng: random.Random = dataclasses.field(default_factory=random.Random, repr=False)  # latencies

    @classmethod
    def build(cls, env_class: type, env: EnvConfig, actors: ActorsConfig, model: ModelConfig) -> "GroupRunner":
        """A runner of `actors.group_size` instances of `env_class(**env.kwargs)`, with the
        model's sampler and tokenizer."""
        tokenizer = make_tokenizer(model)
        return cls(envs=[env_class(**env.kwargs) for _ in range(actors.group_size)],
                   sampler=Sampler(model, stop_ids=tokenizer.stop_ids), tokenizer=tokenizer,
                   env_config=env, actors_config=actors)

    async def run(self, prompt_id: int, prompt: str, attempt: int, params, version: int,
                  key: jax.Array, refresh: Refresh | None = None) -> Group:
        """Plays the group with `params` (of `version`); `refresh()` -> the latest published
        (version, params), consulted every `actors.sync_check_tokens` tokens (`actors.on_sync`)."""
        started = time.time()
        policy = _Policy(params, version, refresh)
        try:
            episodes = await asyncio.wait_for(
                self._play(prompt, policy, key), self.env_config.episode_timeout_s)
            aborted = None
        except (asyncio.TimeoutError, TimeoutError):
            episodes, aborted = [], f"timeout after {self.env_config.episode_timeout_s}s"
        except EpisodeAborted as e:
            episodes, aborted = [], str(e)
        samples = tuple(
            Sample(np.array(e.tokens, np.int32), np.array(e.logprobs, np.float32),
                   np.array(e.versions, np.int32), e.reward, e.success)
            for e in episodes)
        return Group(prompt_id, prompt, samples, started, time.time(), attempt=attempt, aborted=aborted)

    async def _play(self, prompt: str, policy: "_Policy", key: jax.Array) -> list[_Episode]:
        first = await asyncio.gather(*(self._env_call(env.reset, prompt) for env in self.envs))
        start = self.tokenizer.start()
        episodes = [_Episode(env, list(start), [0.0] * len(start), [OBSERVATION] * len(start))
                    for env in self.envs]
        for episode, obs in zip(episodes, first):
            episode.observe(self._encode(obs, first=True))
        for _ in range(self.env_config.max_turns):
            running = [e for e in episodes if not e.done]
            if not running:
                return episodes
            key, turn_key = jax.random.split(key)
            await self._act(running, policy, turn_key)
            results = await asyncio.gather(*(self._step(e) for e in running))
            for episode, (obs, reward, done, info) in zip(running, results):
                self._check_reward(reward)
                episode.reward += float(reward)
                episode.done = bool(done)
                if "success" in info:
                    episode.success = bool(info["success"])
                if not done:
                    episode.observe(self._encode(obs, first=False))
        if any(not e.done for e in episodes):
            raise EpisodeAborted(f"max_turns ({self.env_config.max_turns}) reached without finishing")
        return episodes

    async def _act(self, running: list[_Episode], policy: "_Policy", key: jax.Array) -> None:
        limit = self.sampler.max_len
        if any(len(e.tokens) >= limit for e in running):
            raise EpisodeAborted(f"episode longer than the context window (model.max_len={limit})")
        config = self.actors_config
        if policy.due(config.sync_check_tokens) and config.on_sync != "finish":
            # A turn boundary is a chunk boundary: the next prefill recomputes the cache.
            await asyncio.to_thread(policy.check, config.on_sync)
        # Generate in a thread so that the actor's event loop stays responsive.
        generation = await asyncio.to_thread(
            self.sampler.generate, policy.params, [e.tokens for e in running],
            max_new_tokens=config.max_new_tokens, temperature=config.temperature,
            top_k=config.top_k, top_p=config.top_p, key=key, version=policy.version,
            refresh=policy.refresh, check_every=config.sync_check_tokens, on_sync=config.on_sync)
        if generation.aborted:
            raise EpisodeAborted(f"version {generation.version} published mid-generation (on_sync: abort)")
        policy.params, policy.version = generation.params, generation.version
        policy.since_check += max(len(t) for t in generation.tokens)
        for episode, ids, lps, versions in zip(running, generation.tokens, generation.logprobs,
                                               generation.versions):
            episode.action_start = len(episode.tokens)
            episode.tokens += ids.tolist()
            episode.logprobs += lps.tolist()
            episode.versions += versions.tolist()

    async def _step(self, episode: _Episode):
        action = self.tokenizer.decode(episode.tokens[episode.action_start:])
        if self.env_config.latency_s:
            await asyncio.sleep(self._latency())
        result = await self._env_call(episode.env.step, action)
        if not (isinstance(result, tuple) and len(result) == 4):
            raise EpisodeAborted(f"env.step must return (obs, reward, done, info), got {result!r:.100}")
        return result

    def _latency(self) -> float:
        mean, dist = self.env_config.latency_s, self.env_config.latency_dist
        if dist == "uniform":
            return self._rng.uniform(0.0, 2 * mean)
        if dist == "exponential":
            return self._rng.expovariate(1 / mean)
        return mean

    async def _env_call(self, method, *args):
        timeout = self.env_config.step_timeout_s
        try:
            return await asyncio.wait_for(_call(method, *args), timeout)
        except (asyncio.TimeoutError, TimeoutError):
            raise EpisodeAborted(f"env step timeout after {timeout}s") from None
        except EpisodeAborted:
            raise
        except Exception as e:  # an environment's failure aborts the group, never the actor
            raise EpisodeAborted(f"env error: {type(e).__name__}: {e}") from e

    def _encode(self, obs, *, first: bool) -> list[int]:
        if not isinstance(obs, str):
            raise EpisodeAborted(f"observation must be text, got {type(obs).__name__}")
        try:
            return self.tokenizer.observation(obs, first=first)
        except ValueError as e:
            raise EpisodeAborted(f"observation {obs!r:.60}: {e}") from None

    @staticmethod
    def _check_reward(reward) -> None:
        # A non-finite number is recorded and excluded as `invalid` at the buffer's entry.
        if isinstance(reward, bool) or not isinstance(reward, (int, float)):
            raise EpisodeAborted(f"env error: reward must be a number, got {reward!r:.60}")
