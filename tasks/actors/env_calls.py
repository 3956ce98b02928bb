"""Where environment calls run, and which of them have not returned.

A blocking environment call that times out cannot be stopped: `asyncio.timeout` cancels
the await, not the thread, which stays inside the call, maybe forever. Two things follow.

Its thread is lost. Blocking calls therefore run in threads of their own (`EnvThreads`),
never in those of the actor's Dask I/O (prompt reads, flushes: `tasks.actors.actor`), and a
thread whose call was given up on while it ran is written off: it no longer counts against
the pool's size, so the next call gets a new thread, and it exits if its call ever returns.
Hung calls may hold `max_hung` such threads at most; past that, with one warning, a hung
call keeps its place, and episodes wait for the threads left (their steps time out).

Its environment is still in use. An environment object serves one episode at a time
(README, "Environments"): `EnvCalls` knows, for every environment, which of its calls have
not returned; one whose group ended while such a call ran (timed out, or its group
cancelled) is retired: never handed to another episode, and closed (its `close()`, if it
has one) once the call returns.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import dataclasses
import functools
import inspect
import logging
import os
import threading
from concurrent.futures import Future
from typing import Any, Callable

log = logging.getLogger(__name__)

MAX_HUNG = 256  # threads written off for hung calls that a pool replaces, at most
IDLE_EXIT_S = 30.0  # an idle thread exits: a finished runner's pool leaves none behind


@dataclasses.dataclass
class _Call:
    future: Future
    fn: Callable
    args: tuple

    def run(self) -> None:
        try:
            result = self.fn(*self.args)
        except BaseException as e:  # as a ThreadPoolExecutor's: the caller gets it
            self.future.set_exception(e)
        else:
            self.future.set_result(result)


class EnvThreads:
    """Up to `size` daemon threads running blocking environment calls, plus one for each
    call given up on while it ran (`abandon`), `max_hung` of them at most (module docstring).

    Daemon threads, unlike a ThreadPoolExecutor's (joined at exit): a call that never returns
    must not keep the worker's process, or an `asyncio.run`, from ending."""

    def __init__(self, size: int, max_hung: int = MAX_HUNG):
        self.size, self.max_hung = size, max_hung
        self._calls: collections.deque[_Call] = collections.deque()
        self._lock = threading.Condition()
        self._serving = 0  # threads counted against `size`
        self._idle = 0  # of them, those waiting for a call
        self._running: set[Future] = set()
        self._written_off: set[Future] = set()  # running calls given up on, whose thread was replaced
        self._warned = False

    def submit(self, fn: Callable, *args) -> Future:
        call = _Call(Future(), fn, args)
        with self._lock:
            self._calls.append(call)
            self._grow()
            self._lock.notify()
        return call.future

    def abandon(self, future: Future) -> None:
        """The caller gives up on `future`: a call not started never will be; a running one
        stops counting against the pool (it is presumed hung)."""
        if future.cancel():
            return
        with self._lock:
            if future not in self._running or future in self._written_off:
                return  # returned, or written off already
            if len(self._written_off) >= self.max_hung:
                self._warn_once()
                return
            self._written_off.add(future)
            self._serving -= 1
            self._grow()

    def _grow(self) -> None:
        """A new thread if a call waits with no idle thread to take it (lock held)."""
        if len(self._calls) > self._idle and self._serving < self.size:
            self._serving += 1
            threading.Thread(target=self._serve, name="tandem-env", daemon=True).start()

    def _serve(self) -> None:
        while (call := self._next()) is not None:
            call.run()
            with self._lock:
                self._running.discard(call.future)
                if call.future in self._written_off:  # a new thread has taken this one's place
                    self._written_off.discard(call.future)
                    return
            del call

    def _next(self) -> _Call | None:
        """The next call to run, None once idle for IDLE_EXIT_S (the thread then exits)."""
        with self._lock:
            while True:
                while not self._calls:
                    self._idle += 1
                    woken = self._lock.wait(IDLE_EXIT_S)
                    self._idle -= 1
                    if not woken and not self._calls:
                        self._serving -= 1
                        return None
                call = self._calls.popleft()
                if call.future.set_running_or_notify_cancel():  # False: given up on before it began
                    self._running.add(call.future)
                    return call

    def _warn_once(self) -> None:
        if not self._warned:
            self._warned = True
            log.warning(f"{len(self._written_off)} environment calls have hung past their timeout "
                        f"(max_hung={self.max_hung} threads replaced): further hung calls keep their "
                        f"thread, leaving fewer of the {self.size} for the other episodes, whose steps may "
                        "then time out too. The environment's calls must return (give its tool a timeout)")


def default_threads() -> int:
    """As many threads as a ThreadPoolExecutor has by default (a runner outside an actor)."""
    return min(32, (os.cpu_count() or 1) + 4)


@dataclasses.dataclass
class _Pending:
    """An environment's calls that have not returned."""

    env: Any
    calls: set[Future] = dataclasses.field(default_factory=set)
    retired: bool = False


class EnvCalls:
    """Runs environment calls, and knows which have not returned, environment by environment."""

    def __init__(self, threads: EnvThreads | None = None):
        self.threads = threads or EnvThreads(default_threads())
        self._lock = threading.Lock()
        self._pending: dict[int, _Pending] = {}  # id(env) -> its calls not returned; holds env

    async def call(self, env, method, *args):
        """Awaits an async env method; runs a plain one inline if its class declares
        `blocking = False` (pure computation: a thread hop would cost more than the step),
        else in one of `threads`, so that a slow tool call does not stall the other episodes."""
        if inspect.iscoroutinefunction(method):
            return await self._awaited(env, method, args)
        if not getattr(env, "blocking", True):
            return method(*args)
        future = self.threads.submit(contextvars.copy_context().run, method, *args)  # as asyncio.to_thread
        self._began(env, future)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:  # a timeout, or the group cancelled
            self.threads.abandon(future)
            raise

    def release(self, env) -> bool:
        """The episode is done with `env`. True: it may serve another. False: a call of it
        still runs; it is retired, and closed once its calls have returned."""
        with self._lock:
            pending = self._pending.get(id(env))
            calls = list(pending.calls) if pending else []
        for future in calls:
            future.cancel()  # not started: now it never will (and counts no more)
        with self._lock:
            pending = self._pending.get(id(env))
            if pending is None:
                return True
            pending.retired = True
            return False

    async def _awaited(self, env, method, args):
        # A future that stands for the call while the coroutine runs: a cancelled call still
        # runs until its coroutine has finished (an `except CancelledError` cleaning up).
        future = Future()
        future.set_running_or_notify_cancel()
        self._began(env, future)
        try:
            return await method(*args)
        finally:
            future.set_result(None)

    def _began(self, env, future: Future) -> None:
        with self._lock:
            self._pending.setdefault(id(env), _Pending(env)).calls.add(future)
        future.add_done_callback(functools.partial(self._returned, env))

    def _returned(self, env, future: Future) -> None:
        with self._lock:
            pending = self._pending[id(env)]
            pending.calls.discard(future)
            if pending.calls:
                return
            del self._pending[id(env)]
        if pending.retired:
            close_quietly(env)


def close_quietly(env) -> None:
    """Calls a retired environment's `close()`, if it has one, where its last call returned
    (its thread, or the event loop for an async one); a failure is logged, never raised:
    no episode is waiting on it."""
    close = getattr(env, "close", None)
    if not callable(close):
        return
    try:
        closing = close()
        if inspect.isawaitable(closing):
            _await_closing(closing, env)
    except Exception as e:
        _close_failed(env, e)


_CLOSING: set[asyncio.Task] = set()  # async closes under way (the loop keeps only weak references)


def _await_closing(closing, env) -> None:
    async def finish():
        try:
            await closing
        except Exception as e:
            _close_failed(env, e)

    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # an environment thread: no loop here
        asyncio.run(finish())
        return
    task = loop.create_task(finish())
    _CLOSING.add(task)
    task.add_done_callback(_CLOSING.discard)


def _close_failed(env, error: Exception) -> None:
    log.warning(f"closing a retired {type(env).__name__} failed: {type(error).__name__}: {error}")
