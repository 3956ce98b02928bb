"""The actor: a long-running Dask task, one per worker process, that turns prompts into
groups in the buffer, playing up to `actors.groups_per_worker` groups at once.

All the groups a process plays share its generation service (one batched engine) and one
weight follower, whichever actor tasks of the session run there. The event loop plays the
episodes; blocking Dask calls (reading prompts, sending to the buffer) run in threads so
that no episode waits on them: a few threads of the actor's own, apart from those of
blocking environment calls (`tasks.actors.env_calls.EnvThreads`, one per episode at once),
so that environment calls that hang can hold neither them nor the other episodes' threads
(a hung call's thread is replaced, up to `env_calls.MAX_HUNG` of them).

An environment object serves one episode at a time (README, "Environments"). When a group
ends while a call of one of its environments still runs (a timeout: the thread is not
stopped; or the group cancelled), that environment is retired: closed once the call
returns, and a new instance, `Class(**env.kwargs)`, takes its place in the next group.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import threading
import time
from typing import Callable

from distributed import Client, Event, Queue, get_client

from learner.config import ModelConfig
from tasks.actors.env_calls import EnvCalls, EnvThreads
from tasks.actors.envs import resolve_entrypoint
from tasks.actors.generation import GenerationService, make_engine, use_compile_cache
from tasks.actors.rollout import GroupRunner
from tasks.actors.weights import WeightFollower
from tasks.buffer.channels import Channels
from tasks.buffer.filters import resolve_filter
from tasks.buffer.prompts import Prompt
from tasks.buffer.writer import BufferWriter, EntryChecks
from tasks.config import ActorsConfig, BufferConfig, EnvConfig

FLUSH_S = 0.01  # finished groups wait at most about this long to be sent together
IO_THREADS = 4  # the actor's Dask calls at once: a prompt read, a flush, a stop check
MAX_ENV_THREADS = 256  # threads for blocking environment calls, besides those hung calls hold


@dataclasses.dataclass(frozen=True)
class ActorSetup:
    """Everything an actor needs, picklable to any Dask worker."""

    channels: Channels
    env: EnvConfig
    actors: ActorsConfig
    buffer: BufferConfig
    model: ModelConfig
    seed: int


def run_actor(actor_id: int, setup: ActorSetup) -> dict:
    """Plays prompts until the session stops; returns the actor's timings (every hop timed).

    The learner stops actors by setting the stop event and sending each a `None` prompt."""
    client = get_client()
    with process_generation(setup, client) as (service, follower):
        actor = _Actor.connect(actor_id, setup, client, service, follower)
        return asyncio.run(actor.run())


@dataclasses.dataclass
class _Shared:
    """A session's generation service and weight follower in this process, and how many
    actor tasks use them."""

    service: GenerationService
    follower: WeightFollower
    users: int = 0


# One per worker process and session: the actor tasks a process runs share one engine and one
# copy of the weights. It empties itself when the last task leaves, so nothing needs resetting.
_SHARED: dict[str, _Shared] = {}
_SHARED_LOCK = threading.Lock()


@contextlib.contextmanager
def process_generation(setup: ActorSetup, client: Client):
    """This process's generation service and weight follower for the session, started by
    the first actor task that needs them and stopped when the last one leaves."""
    session = setup.channels.session
    with _SHARED_LOCK:
        if session not in _SHARED:
            use_compile_cache()
            service = GenerationService(make_engine(setup.model, setup.actors)).start()
            _SHARED[session] = _Shared(service, WeightFollower(setup.channels, client, service.load).start())
        shared = _SHARED[session]
        shared.users += 1
    try:
        yield shared.service, shared.follower
    finally:
        with _SHARED_LOCK:
            shared.users -= 1
            if not shared.users:
                del _SHARED[session]
                shared.follower.stop()
                shared.service.stop()


class _Actor:
    @classmethod
    def connect(cls, actor_id: int, setup: ActorSetup, client: Client, service: GenerationService,
                follower: WeightFollower) -> "_Actor":
        """The actor `actor_id` of the session, reading its prompts and writing its groups
        through `client`."""
        checks = EntryChecks({name: resolve_filter(name) for name in setup.buffer.filters},
                             vocab_size=setup.model.vocab_size, max_len=setup.model.max_len)
        return cls(actor_id, setup, Queue(setup.channels.prompts(actor_id), client=client),
                   Event(setup.channels.stop, client=client),
                   BufferWriter(actor_id, setup.channels, client, checks, setup.buffer.inline_bytes),
                   service, follower)

    def __init__(self, actor_id: int, setup: ActorSetup, prompts: Queue, stop: Event, writer: BufferWriter,
                 service: GenerationService, follower: WeightFollower):
        self.id, self.setup, self.service, self.follower = actor_id, setup, service, follower
        self.prompts, self.stop, self.writer = prompts, stop, writer
        self.env_class = resolve_entrypoint(setup.env.entrypoint)
        episodes = setup.actors.groups_per_worker * setup.actors.group_size
        # One environment per episode played at once, reused through `reset` (None: the
        # place of a retired one, built anew when its set is next used).
        self.envs: list[list] = [[self._new_env() for _ in range(setup.actors.group_size)]
                                 for _ in range(setup.actors.groups_per_worker)]
        # Blocking environment calls: a thread for every episode at once (module docstring).
        self.calls = EnvCalls(EnvThreads(min(MAX_ENV_THREADS, episodes)))
        self.io = concurrent.futures.ThreadPoolExecutor(IO_THREADS, thread_name_prefix=f"actor-{actor_id}-io")
        self.runner = GroupRunner.build(service, setup.env, setup.actors, setup.model, setup.seed, self.calls)
        self.stats = {"actor": actor_id, "groups": 0, "rollout_s": 0.0, "queue_put_s": 0.0, "retired_envs": 0,
                      "compile_s": 0.0}

    async def run(self) -> dict:
        # The threads of async environments' own blocking work (`run_in_executor(None)`, as
        # the sandbox's): enough for every episode at once.
        episodes = self.setup.actors.groups_per_worker * self.setup.actors.group_size
        asyncio.get_running_loop().set_default_executor(concurrent.futures.ThreadPoolExecutor(min(256, episodes + 4)))
        flusher: asyncio.Task | None = None
        playing: set[asyncio.Task] = set()
        try:
            await self._io(self.writer.hello)
            await self._io(self.follower.wait_first)
            # Every engine shape compiled before the first prompt is read: an episode's clock
            # (`env.episode_timeout_s`) starts with its group and must not pay for compiles.
            self.stats["compile_s"] = await self._io(self.service.warm_up, episodes)
            flusher = asyncio.create_task(self._flush_every(FLUSH_S))
            while (message := await self._io(self.prompts.get)) is not None:
                if await self._io(self.stop.is_set):
                    break
                for wire in message["prompts"]:
                    await self._start(Prompt.from_wire(wire), message["version"], playing)
        finally:
            for task in playing:
                task.cancel()
            if flusher is not None:
                flusher.cancel()
            self.io.shutdown(wait=False)
        # Shapes compiled by this process's engine, bounded by its slots and window (learner.engine).
        return {**self.stats, "compiles": self.service.engine.compiles, "prefix": self.service.engine.admitted}

    async def _io(self, call: Callable, *args):
        """A blocking Dask call, in the actor's own threads: no environment call can hold them."""
        return await asyncio.get_running_loop().run_in_executor(self.io, call, *args)

    async def _start(self, prompt: Prompt, version: int, playing: set) -> None:
        """Starts playing `prompt` once an environment set is free."""
        while not self.envs:
            await asyncio.wait(playing, return_when=asyncio.FIRST_COMPLETED)
        envs = [env if env is not None else self._new_env() for env in self.envs.pop()]
        task = asyncio.create_task(self._play(prompt, version, envs))
        playing.add(task)
        task.add_done_callback(playing.discard)

    async def _play(self, prompt: Prompt, version: int, envs: list) -> None:
        start = time.perf_counter()
        try:
            await self._loaded(version)
            pin = self.follower.latest if self.setup.actors.on_sync != "retract" else None
            group = await self.runner.run(prompt.id, prompt.text, prompt.attempt, envs, pin)
        finally:
            self.envs.append(self._released(envs))
        self.stats["rollout_s"] += time.perf_counter() - start
        self.stats["groups"] += 1
        self.writer.add(dataclasses.replace(group, arrival_version=self.service.version))

    def _released(self, envs: list) -> list:
        """The set after its group: an environment with a call still running (its group
        timed out or was cancelled) is retired, closed when that call returns, and leaves
        its place empty: an environment serves one episode at a time."""
        kept = [env if self.calls.release(env) else None for env in envs]
        self.stats["retired_envs"] += kept.count(None)
        return kept

    def _new_env(self):
        """An error building one fails the actor, as it would at the start."""
        return self.env_class(**self.setup.env.kwargs)

    async def _loaded(self, version: int) -> None:
        """Waits until the engine has been handed `version` (or a newer one): a prompt is
        played with the weights it was dispatched at, at the oldest, which is what
        synchronous mode and admission control count on. The follower polls every 50 ms;
        one whose poll is stuck fails the actor, naming where, instead of a wait without end."""
        while self.follower.latest[0] < version:
            self.follower.raise_if_stuck()
            await asyncio.sleep(0.005)

    async def _flush_every(self, seconds: float) -> None:
        while True:
            await asyncio.sleep(seconds)
            if self.writer.pending:
                start = time.perf_counter()
                await self._io(self.writer.flush)
                self.stats["queue_put_s"] += time.perf_counter() - start
