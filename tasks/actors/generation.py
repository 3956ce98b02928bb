"""The generation service of one actor process: one continuous-batching engine
(`learner.engine`) for every episode the process plays.

Episodes are coroutines on the actors' event loop; the engine runs in a thread of its own,
so environment steps (and their slow tools) go on while it decodes, and JAX releases the
GIL while it computes. An episode submits a request and awaits its completion; the thread
admits requests between decode chunks and resolves the completions of each chunk with one
call into the event loop. Weights arrive with `load` from any thread and are handed to the
engine between two of its steps (the engine itself is single-threaded).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
from typing import Any

from learner.chat import make_tokenizer
from learner.config import ModelConfig
from learner.engine import Completion, Engine, Request
from learner.sampling import SamplingParams
from tasks.background import Background
from tasks.config import ActorsConfig


def actor_sampling(actors: ActorsConfig) -> SamplingParams:
    """How the actors draw tokens (the behaviour policy)."""
    return SamplingParams(actors.temperature, actors.top_k, actors.top_p)


def make_engine(model: ModelConfig, actors: ActorsConfig) -> Engine:
    """The batched engine of an actor process, as the spec sets it."""
    return Engine(model, slots=actors.slots, stop_ids=make_tokenizer(model).stop_ids,
                  sampling=actor_sampling(actors), check_every=actors.sync_check_tokens)


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
        for request, future in requests:
            self._waiting[self.engine.submit(request)] = future

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
