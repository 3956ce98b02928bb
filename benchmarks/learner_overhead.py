"""Part 2 of benchmarks/buffer_latency.py: what the buffer costs the learner per step.

A real `BufferReader` over real `BufferWriter`s ("canned" actors that answer every
prompt with the same group at once, so the buffer stays full) and the default spec's
train step. Per step: `take` time when the buffer was not empty, and the train step
while the intake works (fetching, reading reports, dispatching) against the same step
while it idles, in alternating blocks of steps.

In two layouts of the learner process's threads:
- "one core": all of them on the learner's core, as on a host without an accelerator,
  where the intake's CPU work is taken from the train step;
- "device apart": XLA's threads (the train step's computation) alone on the learner's
  core and the Python threads (the step's dispatch, `take`, the exchange thread, the Dask
  client) on the host cores, as with an accelerator, which computes apart from the host.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
import uuid

import cloudpickle
import numpy as np
import psutil
from distributed import Client, Queue, get_client

from flows.spec import load_spec
from learner.batching import batch_of_groups
from learner.sharding import make_mesh
from learner.train import TrainStep, init_train_state
from learner.trajectory import Group, Sample
from tasks.buffer.ledger import Ledger
from tasks.buffer.channels import Channels, stop_actors
from tasks.buffer.exchange import Exchange
from tasks.buffer.reader import BufferReader
from tasks.buffer.writer import BufferWriter, EntryChecks
from tasks.buffer.prompts import Prompt, PromptSource
from tasks.actors.envs import resolve_entrypoint
from tasks.buffer.intake import IntakeRules, Pace

from harness import pin_threads

SPEC = "specs/guess-number.yaml"
ACTORS = 2
BLOCK = 10  # steps in a row with the intake at work, then as many without
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Unpublished:
    """The learner's versions: none is published here."""

    current = visible = 0


def canned_group(group_size: int, length: int, vocab: int) -> Group:
    """A group of `group_size` episodes of `length` tokens, observations and actions alternating."""
    rng = np.random.default_rng(0)
    versions = np.where(np.arange(length) % 2 == 1, 0, -1).astype(np.int32)
    samples = tuple(Sample(rng.integers(3, vocab, length).astype(np.int32), np.full(length, -2.0, np.float32),
                           versions, float(i % 2), bool(i % 2)) for i in range(group_size))
    return Group(0, "canned", samples, 0.0, 0.0)


def canned_actor(actor: int, channels: Channels, checks: EntryChecks, inline_bytes: int, group: Group) -> None:
    client = get_client()
    prompts = Queue(channels.prompts(actor), client=client)
    writer = BufferWriter(actor, channels, client, checks, inline_bytes)
    writer.hello()
    while (message := prompts.get()) is not None:
        for prompt in map(Prompt.from_wire, message["prompts"]):
            writer.add(dataclasses.replace(group, prompt_id=prompt.id, attempt=prompt.attempt))
        writer.flush()


def learner_overhead(client: Client, steps: int, learner_cores: set[int], host_cores: set[int]) -> list[dict]:
    # No version is published here (the reader's clock stays at 0), so admission control
    # would stop dispatch at the staleness budget, short of the full buffer the steps take.
    spec = load_spec(SPEC, ["buffer.admission=false"])
    # Room for every group the timed steps take, filled before they start: the buffer is
    # never empty in the Dask queue, whatever the producers' pace on this machine.
    batch_groups = spec.learner.batch_groups
    capacity = (2 * (steps + 2 * BLOCK) + 1) * batch_groups
    env_class = resolve_entrypoint(spec.env.entrypoint)
    rules = IntakeRules(spec.buffer, Ledger(), PromptSource(spec.data, env_class, spec.env.kwargs, 0),
                        Pace(batch_groups, spec.sync.interval, capacity + ACTORS + batch_groups), ACTORS,
                        log=lambda _: None)
    channels = Channels(uuid.uuid4().hex[:8])
    reader = BufferReader(rules, Unpublished(), prefetch=2 * batch_groups)  # as the session's
    exchange = Exchange(channels, client, rules, reader, capacity=capacity).start()
    group = canned_group(spec.actors.group_size, spec.model.max_len, spec.model.vocab_size)
    checks = EntryChecks({}, spec.model.vocab_size, spec.model.max_len)
    actors = [client.submit(canned_actor, a, channels, checks, spec.buffer.inline_bytes, group, pure=False)
              for a in range(ACTORS)]
    mesh = make_mesh(spec.learner.mesh)
    state, train_step = init_train_state(spec.model, spec.learner, seed=0, mesh=mesh), TrainStep(spec.model, spec.learner, mesh)
    batch = batch_of_groups(reader.take(batch_groups), spec.learner)
    state, _ = train_step(state, batch)  # compile; XLA's threads exist from here on
    layouts = {"one core": lambda: _pin(learner_cores, learner_cores),
               "device apart": lambda: _pin(learner_cores, host_cores)}
    while reader.depth < capacity:  # let the actors fill the buffer
        time.sleep(0.1)
    reader.pop_stats()
    rows = []
    for layout, pin in layouts.items():
        pin()
        take_s, times, waited = [], {True: [], False: []}, 0
        # Blocks with the intake at work (take, then the step) and without (the step on a
        # batch in hand; the intake then idles, reading reports every IDLE_MAX_S), taken in
        # turns so that drift on a shared machine falls on both alike. A block's first step
        # is not counted: it overlaps the intake's work for the block before.
        for block in range(2 * -(-steps // BLOCK)):
            buffered = block % 2 == 0
            for i in range(BLOCK + 1):
                if buffered:
                    start = time.perf_counter()
                    groups = reader.take(batch_groups)
                    took = time.perf_counter() - start
                    waited += reader.pop_stats().wait_count > 0
                    state, seconds = _timed_step(train_step, state, batch_of_groups(groups, spec.learner))
                else:
                    state, seconds = _timed_step(train_step, state, batch)
                if i:
                    times[buffered].append(seconds)
                    if buffered:
                        take_s.append(took)
        base, take = np.median(times[False]), np.median(take_s)
        slowdown = np.median(times[True]) - base
        rows.append({"layout": layout, "batch_groups": batch_groups, "steps": len(take_s), "steps_that_waited": waited,
                     "train_ms": 1e3 * base, "take_ms": 1e3 * take,
                     "take_p99_ms": 1e3 * float(np.percentile(take_s, 99)),
                     "train_slowdown_ms": 1e3 * slowdown, "overhead_%": 100 * (take + max(slowdown, 0.0)) / base})
    exchange.stop()
    stop_actors(client, channels, ACTORS, done=lambda: all(f.done() for f in actors), timeout_s=60)
    exchange.release()
    return rows


def _pin(device_cores: set[int], python_cores: set[int]) -> None:
    """XLA's threads (this process's threads that Python did not start) on `device_cores`,
    Python's on `python_cores`."""
    python = {t.native_id for t in threading.enumerate()}
    pin_threads(psutil.Process(), python_cores, only=python.__contains__)
    pin_threads(psutil.Process(), device_cores, only=lambda tid: tid not in python)


def _timed_step(train_step, state, batch):
    start = time.perf_counter()
    state, _ = train_step(state, batch)  # its metrics are host floats: the step has finished
    return state, time.perf_counter() - start
