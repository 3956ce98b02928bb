"""The actor: a long-running Dask task, one per worker process, that turns prompts into
groups in the buffer, playing up to `actors.actors` groups at once.

All the groups a process plays share its generation service (one batched engine) and one
weight follower, whichever actor tasks of the session run there. The event loop plays the
episodes; blocking Dask calls (reading prompts, sending to the buffer) run in threads so
that no episode waits on them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import threading
import time

from distributed import Client, Event, Queue, get_client

from learner.config import ModelConfig
from tasks.actors.envs import resolve_entrypoint
from tasks.actors.generation import GenerationService, make_engine
from tasks.actors.rollout import GroupRunner
from tasks.actors.weights import WeightFollower
from tasks.buffer.channels import Channels
from tasks.buffer.filters import resolve_filter
from tasks.buffer.prompts import Prompt
from tasks.buffer.writer import BufferWriter, EntryChecks
from tasks.config import ActorsConfig, BufferConfig, EnvConfig

FLUSH_S = 0.01  # finished groups wait at most about this long to be sent together


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
        actor = _Actor(actor_id, setup, client, service, follower)
        return asyncio.run(actor.run())


_SHARED: dict[str, list] = {}  # session -> [service, follower, users]
_SHARED_LOCK = threading.Lock()


@contextlib.contextmanager
def process_generation(setup: ActorSetup, client: Client):
    """This process's generation service and weight follower for the session, started by
    the first actor task that needs them and stopped when the last one leaves."""
    session = setup.channels.session
    with _SHARED_LOCK:
        if session not in _SHARED:
            service = GenerationService(make_engine(setup.model, setup.actors)).start()
            follower = WeightFollower(setup.channels, client, service.load).start()
            _SHARED[session] = [service, follower, 0]
        shared = _SHARED[session]
        shared[2] += 1
    try:
        yield shared[0], shared[1]
    finally:
        with _SHARED_LOCK:
            shared[2] -= 1
            if not shared[2]:
                del _SHARED[session]
                shared[1].stop()
                shared[0].stop()


class _Actor:
    def __init__(self, actor_id: int, setup: ActorSetup, client: Client, service: GenerationService,
                 follower: WeightFollower):
        self.id, self.setup, self.service, self.follower = actor_id, setup, service, follower
        self.prompts = Queue(setup.channels.prompts(actor_id), client=client)
        self.stop = Event(setup.channels.stop, client=client)
        checks = EntryChecks({name: resolve_filter(name) for name in setup.buffer.filters},
                             vocab_size=setup.model.vocab_size, max_len=setup.model.max_len)
        self.writer = BufferWriter(actor_id, setup.channels, client, checks, setup.buffer.inline_bytes)
        env_class = resolve_entrypoint(setup.env.entrypoint)
        # One environment per episode played at once, reused through `reset`.
        self.envs = [[env_class(**setup.env.kwargs) for _ in range(setup.actors.group_size)]
                     for _ in range(setup.actors.actors)]
        self.runner = GroupRunner.build(service, setup.env, setup.actors, setup.model, setup.seed)
        self.stats = {"actor": actor_id, "groups": 0, "rollout_s": 0.0, "queue_put_s": 0.0}

    async def run(self) -> dict:
        loop = asyncio.get_running_loop()
        # Blocking environments' calls run in threads: enough for every episode at once.
        episodes = self.setup.actors.actors * self.setup.actors.group_size
        loop.set_default_executor(concurrent.futures.ThreadPoolExecutor(min(256, episodes + 4)))
        await asyncio.to_thread(self.writer.hello)
        await asyncio.to_thread(self.follower.wait_first)
        flusher = asyncio.create_task(self._flush_every(FLUSH_S))
        playing: set[asyncio.Task] = set()
        try:
            while (message := await asyncio.to_thread(self.prompts.get)) is not None:
                if await asyncio.to_thread(self.stop.is_set):
                    break
                for wire in message["prompts"]:
                    await self._start(Prompt.from_wire(wire), message["version"], playing)
        finally:
            for task in playing:
                task.cancel()
            flusher.cancel()
        # Shapes compiled by this process's engine, bounded by its slots and window (learner.engine).
        return {**self.stats, "compiles": self.service.engine.compiles, "prefix": self.service.engine.admitted}

    async def _start(self, prompt: Prompt, version: int, playing: set) -> None:
        """Starts playing `prompt` once an environment set is free."""
        while not self.envs:
            await asyncio.wait(playing, return_when=asyncio.FIRST_COMPLETED)
        envs = self.envs.pop()
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
            self.envs.append(envs)
        self.stats["rollout_s"] += time.perf_counter() - start
        self.stats["groups"] += 1
        self.writer.add(dataclasses.replace(group, arrival_version=self.service.version))

    async def _loaded(self, version: int) -> None:
        """Waits until the engine has been handed `version` (or a newer one): a prompt is
        played with the weights it was dispatched at, at the oldest, which is what
        synchronous mode and admission control count on. The follower polls every 50 ms."""
        while self.follower.latest[0] < version:
            self.follower.raise_if_failed()
            await asyncio.sleep(0.005)

    async def _flush_every(self, seconds: float) -> None:
        while True:
            await asyncio.sleep(seconds)
            if self.writer.pending:
                start = time.perf_counter()
                await asyncio.to_thread(self.writer.flush)
                self.stats["queue_put_s"] += time.perf_counter() - start
