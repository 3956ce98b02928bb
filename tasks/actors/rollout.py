"""One group: `group_size` multi-turn episodes of one prompt, each a coroutine of its own.

An episode asks the process's generation service for each action (so every episode the
process plays decodes in one batch), then steps its environment; while it waits on a slow
tool it holds no decode slot, and its siblings go on. Every generated token records its
log-prob and the version of the weights that produced it; observation tokens record -1.

Which weights a group uses follows `actors.on_sync` (README, "Versions, staleness, the
buffer"): "retract" follows the latest (the engine switches at a check boundary and
recomputes the cache), "finish" keeps the version the group started with, "abort" keeps it
too and drops the group if a newer one is published before an action completes.

Environment calls go through the runner's `EnvCalls` (`tasks.actors.env_calls`): blocking
ones in threads of their own, and every environment's calls not yet returned known, so
that an actor hands no environment to an episode while a timed-out call still runs in it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from typing import Any, Awaitable, Callable, Hashable

import numpy as np

from learner.chat import ChatTokenizer, make_tokenizer
from learner.config import ModelConfig
from learner.engine import Completion, Request
from learner.tokenizer import OutsideAlphabet
from learner.trajectory import OBSERVATION, Abort, AbortKind, Group, Sample
from tasks.actors.env_calls import EnvCalls
from tasks.config import ActorsConfig, EnvConfig

Generate = Callable[[Request], Awaitable[Completion]]


class EpisodeAborted(Exception):
    """The group cannot be completed, for `abort`."""

    def __init__(self, kind: AbortKind, message: str, **about):
        super().__init__(message)
        self.abort = Abort(kind, message, **about)


@dataclasses.dataclass
class _Episode:
    tokens: list[int]
    logprobs: list[float]
    versions: list[int]
    reward: float = 0.0
    success: bool | None = None

    def observe(self, ids: list[int]) -> None:
        self.tokens += ids
        self.logprobs += [0.0] * len(ids)
        self.versions += [OBSERVATION] * len(ids)

    def act(self, completion: Completion) -> None:
        self.tokens += completion.tokens.tolist()
        self.logprobs += completion.logprobs.tolist()
        self.versions += completion.versions.tolist()

    def sample(self) -> Sample:
        return Sample(np.array(self.tokens, np.int32), np.array(self.logprobs, np.float32),
                      np.array(self.versions, np.int32), self.reward, self.success)


@dataclasses.dataclass
class GroupRunner:
    """Plays groups with a process's generation service, tokenizer and the spec's settings."""

    generate: Generate
    release: Callable[[Hashable], None]  # an episode ended: its cached context may go
    tokenizer: ChatTokenizer
    env_config: EnvConfig
    actors_config: ActorsConfig
    max_len: int  # the model's context window
    seed: int = 0
    calls: EnvCalls = dataclasses.field(default_factory=EnvCalls, repr=False)  # where env calls run
    _rng: random.Random = dataclasses.field(default_factory=random.Random, repr=False)  # latencies

    @classmethod
    def build(cls, service, env: EnvConfig, actors: ActorsConfig, model: ModelConfig, seed: int = 0,
              calls: EnvCalls | None = None) -> "GroupRunner":
        """A runner of the spec's settings playing through `service` (a `GenerationService`),
        its environment calls through `calls` (by default, its own)."""
        return cls(service.generate, service.release, make_tokenizer(model), env, actors, model.max_len, seed,
                   calls or EnvCalls())

    async def run(self, prompt_id: int, prompt: str, attempt: int, envs: list,
                  pin: tuple[int, Any] | None = None) -> Group:
        """Plays `prompt` once in each of `envs`; `pin` = (version, params) for on_sync
        "finish" and "abort" (the weights the group started with), None to follow the latest."""
        started = time.time()
        try:
            async with asyncio.timeout(self.env_config.episode_timeout_s):
                episodes = await _all(self._episode(env, prompt, (prompt_id, attempt, i), pin)
                                      for i, env in enumerate(envs))
            samples, aborted = tuple(e.sample() for e in episodes), None
        except TimeoutError:
            samples, aborted = (), Abort(AbortKind.TIMEOUT, f"timeout after {self.env_config.episode_timeout_s}s")
        except EpisodeAborted as e:
            samples, aborted = (), e.abort
        return Group(prompt_id, prompt, samples, started, time.time(), attempt=attempt, aborted=aborted)

    async def _episode(self, env, prompt: str, ids: tuple[int, int, int], pin) -> _Episode:
        try:
            return await self._turns(env, prompt, ids, pin)
        finally:
            self.release(ids)

    async def _turns(self, env, prompt: str, ids: tuple[int, int, int], pin) -> _Episode:
        episode = _Episode(*[list(x) for x in _start(self.tokenizer)])
        episode.observe(self._encode(await self._env_call(env, env.reset, prompt), first=True))
        for turn in range(self.env_config.max_turns):
            completion = await self._act(episode, ids, turn, pin)
            episode.act(completion)
            obs, reward, done, info = await self._step(env, self.tokenizer.decode(completion.tokens))
            episode.reward += float(reward)
            if "success" in info:
                episode.success = bool(info["success"])
            if done:
                return episode
            episode.observe(self._encode(obs, first=False))
        raise EpisodeAborted(AbortKind.MAX_TURNS, f"max_turns ({self.env_config.max_turns}) reached without finishing")

    async def _act(self, episode: _Episode, ids: tuple[int, int, int], turn: int, pin) -> Completion:
        if len(episode.tokens) >= self.max_len:
            raise EpisodeAborted(AbortKind.CONTEXT, f"episode longer than the context window (model.max_len={self.max_len})")
        version, params = pin if pin is not None else (None, None)
        # The episode's identity keys its context's cache in the engine: the next turn
        # prefills only what was added since.
        completion = await self.generate(Request(
            np.array(episode.tokens, np.int32), self.actors_config.max_new_tokens, _request_key(self.seed, *ids, turn),
            version=version, params=params, prefix_key=ids))
        if completion.newer and self.actors_config.on_sync == "abort":
            raise EpisodeAborted(AbortKind.NEWER_VERSION, f"a version newer than {completion.versions[0]} was "
                                 "published mid-episode (on_sync: abort)")
        return completion

    async def _step(self, env, action: str):
        if self.env_config.latency_s:
            await asyncio.sleep(self._latency())
        result = await self._env_call(env, env.step, action)
        if not (isinstance(result, tuple) and len(result) == 4):
            raise EpisodeAborted(AbortKind.PROTOCOL, f"env.step must return (obs, reward, done, info), got {result!r:.100}",
                                 about="step's result")
        reward = result[1]
        # A non-finite number is recorded and excluded as `invalid` at the buffer's entry.
        if isinstance(reward, bool) or not isinstance(reward, (int, float)):
            raise EpisodeAborted(AbortKind.PROTOCOL, f"env error: reward must be a number, got {reward!r:.60}",
                                 about="reward")
        if not isinstance(result[3], dict):
            raise EpisodeAborted(AbortKind.PROTOCOL, f"env error: info must be a dict, got {type(result[3]).__name__}",
                                 about="info")
        return result

    def _latency(self) -> float:
        mean, dist = self.env_config.latency_s, self.env_config.latency_dist
        if dist == "uniform":
            return self._rng.uniform(0.0, 2 * mean)
        if dist == "exponential":
            return self._rng.expovariate(1 / mean)
        return mean

    async def _env_call(self, env, method, *args):
        timeout = self.env_config.step_timeout_s
        try:
            async with asyncio.timeout(timeout):
                return await self.calls.call(env, method, *args)
        except TimeoutError:
            raise EpisodeAborted(AbortKind.STEP_TIMEOUT, f"env step timeout after {timeout}s") from None
        except (EpisodeAborted, asyncio.CancelledError):
            raise
        except Exception as e:  # an environment's failure aborts the group, never the actor
            raise EpisodeAborted(AbortKind.ENV_ERROR, f"env error: {type(e).__name__}: {e}",
                                 about=type(e).__name__, error=str(e)) from e

    def _encode(self, obs, *, first: bool) -> list[int]:
        if not isinstance(obs, str):
            raise EpisodeAborted(AbortKind.PROTOCOL, f"observation must be text, got {type(obs).__name__}",
                                 about="observation")
        try:
            return self.tokenizer.observation(obs, first=first)
        except OutsideAlphabet as e:
            raise EpisodeAborted(AbortKind.ALPHABET, f"observation {obs!r:.60}: {e}", about=e.char,
                                 observation=f"{obs!r:.60}") from None
        except ValueError as e:
            raise EpisodeAborted(AbortKind.PROTOCOL, f"observation {obs!r:.60}: {e}", about="observation") from None


async def _all(coroutines) -> list:
    """Every result, or the first exception with the others cancelled (an aborted group's
    other episodes stop at once, freeing their slots; an environment still inside a call
    is retired by the actor, `EnvCalls.release`)."""
    tasks = [asyncio.ensure_future(c) for c in coroutines]
    try:
        return await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()


def _start(tokenizer: ChatTokenizer) -> tuple[list[int], list[float], list[int]]:
    start = tokenizer.start()
    return start, [0.0] * len(start), [OBSERVATION] * len(start)


def _request_key(seed: int, prompt_id: int, attempt: int, episode: int, turn: int) -> np.ndarray:
    """The PRNG key data of one action: a function of where it is played, not of when or
    beside what, so a replayed prompt draws the same tokens."""
    word0 = (seed * 0x9E3779B1 + prompt_id * 0x85EBCA77 + attempt) & 0xFFFFFFFF
    return np.array([word0, (episode << 16) | turn], np.uint32)
