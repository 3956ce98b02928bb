"""The generation service of one actor process: one continuous-batching engine
(`learner.engine`) for every episode the process plays.

Episodes are coroutines on the actors' event loop; the engine runs in a thread of its own,
so environment steps (and their slow tools) go on while it decodes, and JAX releases the
GIL while it computes. An episode submits a request and awaits its completion; the thread
admits requests between decode chunks and resolves the completions of each chunk with one
call into the event loop. Weights arrive with `load` from any thread and are handed to the
engine between two of its steps (the engine itself is single-threaded). `warm_up` compiles
the engine's shapes on that thread before the caller starts its first episode.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

import jax

from learner.chat import make_tokenizer
from learner.config import ModelConfig
from learner.engine import Completion, Engine, Request
from learner.sampling import SamplingParams
from tasks.background import Background
from tasks.config import ActorsConfig

log = logging.getLogger(__name__)


def use_compile_cache() -> None:
    """Keeps this process's XLA compiles on disk (JAX's persistent compilation cache, in
    `TANDEM_HOME/jax-cache`, `~/.tandem/jax-cache` by default, unless
    JAX_COMPILATION_CACHE_DIR names another), so that the next process of the same model
    and slots on this machine (a resume, an evaluation, the next run) loads its engine's
    shapes instead of compiling them: the demo engine's 26 shapes for 16 requests at once
    took 36 s of CPU to compile, 5 s to load (README, "Actors"). Only a process's first
    compile decides whether it uses the cache: call this before it."""
    if jax.config.jax_compilation_cache_dir is None:
        home = Path(os.environ.get("TANDEM_HOME") or Path.home() / ".tandem").expanduser()
        jax.config.update("jax_compilation_cache_dir", str(home / "jax-cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)  # an engine's shapes take ~1 s each


def actor_sampling(actors: ActorsConfig) -> SamplingParams:
    """How the actors draw tokens (the behaviour policy)."""
    return SamplingParams(actors.temperature, actors.top_k, actors.top_p)


def make_engine(model: ModelConfig, actors: ActorsConfig) -> Engine:
    """The batched engine of an actor process, as the spec sets it."""
    return Engine(model, slots=actors.slots, stop_ids=make_tokenizer(model).stop_ids,
                  sampling=actor_sampling(actors), check_every=actors.sync_check_tokens,
                  kv_cache_dtype=actors.kv_cache_dtype)


@contextlib.contextmanager
def local_generation(model: ModelConfig, actors: ActorsConfig, params: Any, version: int = 0):
    """A generation service in this process with `params` loaded, stopped on exit: for
    playing groups without Dask (the audit, the single-process floor, tests)."""
    service = GenerationService(make_engine(model, actors)).start()
    service.load(version, params)
    try:
        yield service
    finally:
        service.stop()


class GenerationService(Background):
    """Serves `await generate(request)` from coroutines on any event loop of this process."""

    def __init__(self, engine: Engine):
        super().__init__("tandem-generation")
        self.engine = engine
        self._lock = threading.Lock()
        self._inbox: collections.deque[tuple[Request, asyncio.Future]] = collections.deque()
        self._ended: list = []  # prefix keys of episodes that ended: their warm slots go cold
        self._load: tuple[int, Any] | None = None
        self._work = threading.Event()  # set when there is something to take
        self._waiting: dict[int, asyncio.Future] = {}  # by engine request id
        self._warm_up: tuple[int, concurrent.futures.Future] | None = None  # (requests in flight, its seconds)
        self.version: int | None = None  # the latest loaded, once the engine has it

    async def generate(self, request: Request) -> Completion:
        self.raise_if_failed()
        future = asyncio.get_running_loop().create_future()
        with self._lock:
            self._inbox.append((request, future))
        self._work.set()
        return await future

    def release(self, prefix_key) -> None:
        """An episode ended: the slot that kept its context warm may go to anyone."""
        with self._lock:
            self._ended.append(prefix_key)

    def load(self, version: int, params: Any) -> None:
        """Hands the newest weights over; the engine takes them before its next step."""
        with self._lock:
            self._load = (version, params)
        self._work.set()

    def warm_up(self, in_flight: int) -> float:
        """Compiles the engine's shapes for up to `in_flight` requests at once
        (`Engine.warm_up`) on its thread, and waits for it: the caller starts no episode
        before, so that no episode's clock (`env.episode_timeout_s`) pays a compile. Once
        per service: a later call (another actor task of the process) waits for the first
        one's. Needs weights handed over first (`load`). Returns the seconds it took."""
        with self._lock:
            if self._warm_up is None:
                self._warm_up = (in_flight, concurrent.futures.Future())
            done = self._warm_up[1]
        self._work.set()
        while True:
            try:
                return done.result(timeout=0.5)
            except concurrent.futures.TimeoutError:
                self.raise_if_failed()
                if self._stopping.is_set():
                    raise RuntimeError("the generation service stopped before its engine was warmed up") from None

    def _run(self) -> None:
        while not self._stopping.is_set():
            self._work.wait(0.5)
            self._work.clear()
            self._take_inbox()
            while not self.engine.idle and not self._stopping.is_set():
                _resolve(self.engine.step(), self._waiting)
                self._take_inbox()

    def _take_inbox(self) -> None:
        with self._lock:
            load, self._load = self._load, None
            requests = list(self._inbox)
            self._inbox.clear()
            ended, self._ended = self._ended, []
        for prefix_key in ended:
            self.engine.release(prefix_key)
        if load is not None:
            self.engine.load(*load)
            self.version = load[0]
        self._warm_up_once()
        for request, future in requests:
            self._waiting[self.engine.submit(request)] = future

    def _warm_up_once(self) -> None:
        """Runs the warm-up asked for, once weights are loaded, if it has not run; logs its cost."""
        with self._lock:
            asked = self._warm_up
        if asked is None or asked[1].done() or self.version is None:
            return
        in_flight, done = asked
        start = time.perf_counter()
        try:
            shapes = self.engine.warm_up(in_flight)
        except Exception as e:  # to the callers waiting, as their own error
            done.set_exception(e)
            return
        seconds = time.perf_counter() - start
        log.info(f"engine compiled in {seconds:.1f}s: its decode and {shapes - 1} prefill shapes, "
                 f"for up to {in_flight} requests at once")
        done.set_result(seconds)

    def _wake(self) -> None:
        self._work.set()

    def _failed(self, error: BaseException) -> None:
        for future in self._waiting.values():
            _call_into(future.get_loop(), _fail, future, error)


def _resolve(completions: list[Completion], waiting: dict[int, asyncio.Future]) -> None:
    """Wakes the episodes whose requests completed: one call into each event loop."""
    by_loop: dict[asyncio.AbstractEventLoop, list] = collections.defaultdict(list)
    for completion in completions:
        future = waiting.pop(completion.id)
        by_loop[future.get_loop()].append((future, completion))
    for loop, done in by_loop.items():
        _call_into(loop, _set_results, done)


def _call_into(loop: asyncio.AbstractEventLoop, callback, *args) -> None:
    """`callback(*args)` on `loop`, unless the loop has closed: a request's episode may
    end (cancelled) with its loop (one `asyncio.run` per group, as the audit plays) while
    the engine still decodes it, and nobody awaits its completion any more."""
    with contextlib.suppress(RuntimeError):  # closed between a check and the call
        if not loop.is_closed():
            loop.call_soon_threadsafe(callback, *args)


def _set_results(done: list[tuple[asyncio.Future, Completion]]) -> None:
    for future, completion in done:
        if not future.done():  # cancelled: its episode timed out
            future.set_result(completion)


def _fail(future: asyncio.Future, error: BaseException) -> None:
    if not future.done():
        future.set_exception(RuntimeError(f"generation failed: {type(error).__name__}: {error}"))
