"""The actor: a long-running Dask task that turns prompts into groups in the buffer."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time

import jax
from distributed import Event, Queue, get_client

from learner.config import ModelConfig
from tasks.buffer.channels import Channels
from tasks.buffer.writer import BufferWriter, EntryChecks
from tasks.config import ActorsConfig, BufferConfig, EnvConfig
from tasks.buffer.prompts import Prompt
from tasks.actors.envs import resolve_entrypoint
from tasks.buffer.filters import resolve_filter
from tasks.actors.rollout import GroupRunner
from tasks.actors.weights import WeightSubscriber


_CLIENT_LOCK = threading.Lock()


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
    """Loops prompt -> group (latest weights) -> buffer until the session stops.

    The learner stops actors by setting the stop event and sending each a `None` prompt.
    Returns the actor's timings (cleanba-style: every hop timed).
    """
    with _CLIENT_LOCK:  # actors sharing a worker must not create its client concurrently
        client = get_client()
    channels = setup.channels
    prompts = Queue(channels.prompts(actor_id), client=client)
    stop = Event(channels.stop, client=client)
    weights = WeightSubscriber(channels, client, load=jax.device_put)
    checks = EntryChecks({name: resolve_filter(name) for name in setup.buffer.filters},
                         vocab_size=setup.model.vocab_size, max_len=setup.model.max_len)
    writer = BufferWriter(actor_id, channels, client, checks, setup.buffer.inline_bytes)
    writer.hello()
    runner = GroupRunner.build(resolve_entrypoint(setup.env.entrypoint), setup.env, setup.actors, setup.model)
    base_key = jax.random.PRNGKey(setup.seed)
    stats = {"actor": actor_id, "groups": 0, "rollout_s": 0.0, "params_get_s": 0.0, "queue_put_s": 0.0}
    while (message := prompts.get()) is not None:  # a message: the prompts of one dispatch
        for wire in message:
            if stop.is_set():
                return stats
            _play(Prompt.from_wire(wire), runner, weights, writer, base_key, stats)
    return stats


def _play(prompt: Prompt, runner: GroupRunner, weights: WeightSubscriber, writer: BufferWriter,
          base_key: jax.Array, stats: dict) -> None:
    start = time.perf_counter()
    version, params = weights.latest()
    stats["params_get_s"] += time.perf_counter() - start
    key = jax.random.fold_in(jax.random.fold_in(base_key, prompt.id), prompt.attempt)
    start = time.perf_counter()
    group = asyncio.run(runner.run(prompt.id, prompt.text, prompt.attempt, params, version,
                                   key, refresh=weights.latest))
    stats["rollout_s"] += time.perf_counter() - start
    start = time.perf_counter()
    writer.put(dataclasses.replace(group, arrival_version=weights.version()))
    stats["queue_put_s"] += time.perf_counter() - start
    stats["groups"] += 1
