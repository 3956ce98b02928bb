"""Episodes per second per actor core: Tandem's actors against an in-process batched floor.

Both play the default spec's game with its model at random init, latency off, on one core
with the XLA settings an actor process runs with.
- Tandem: one real actor process (a `dask worker` pinned to the core) running the actor
  task, its engine and its writer; this process is the learner's side (the intake's rules,
  the exchange thread, a reader), taking groups as fast as they arrive without training.
  Episodes/s are counted from the groups taken (every episode of a finished group,
  filtered ones included: the actor played them) over `--seconds` after a warm-up.
- The floor (`floor`, written here): a batch of 256 episodes; each turn one jitted call
  runs the model over every episode's context and samples its action, then every
  environment steps in Python; a finished episode starts anew.
Usage:

    python benchmarks/actor_throughput.py [--seconds 20] [--batch 256] [--set path=value ...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np

from harness import ROOT, actor_pool, connect_workers, emit, split_cores

SPEC = "specs/guess-number.yaml"


def floor(spec, batch: int, seconds: float) -> dict:
    """Episodes/s of the in-process loop: one jitted call per turn for `batch` episodes."""
    import jax
    import jax.numpy as jnp

    from learner.chat import make_tokenizer
    from learner.model import forward_fn, init_params
    from tasks.actors.envs import resolve_entrypoint

    tokenizer, model = make_tokenizer(spec.model), spec.model
    env_class = resolve_entrypoint(spec.env.entrypoint)
    envs = [env_class(**spec.env.kwargs) for _ in range(batch)]
    params = init_params(model, 0)
    forward = forward_fn(model)

    @jax.jit
    def act(params, tokens, lengths, key):  # the next token of every row, sampled
        logits = forward(params, tokens, jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape),
                         jnp.ones_like(tokens))
        last = jnp.take_along_axis(logits, (lengths - 1)[:, None, None], axis=1)[:, 0]
        return jax.random.categorical(key, last)

    rng = np.random.default_rng(0)
    import random
    contexts = [_reset(env, tokenizer, random.Random(i)) for i, env in enumerate(envs)]
    key, done, start = jax.random.PRNGKey(0), 0, None
    for turn in range(10**9):
        if turn == 20:
            start, done = time.perf_counter(), 0
        if start and time.perf_counter() - start > seconds:
            break
        tokens = np.zeros((batch, model.max_len), np.int32)
        for row, context in enumerate(contexts):
            tokens[row, : len(context)] = context
        lengths = np.array([len(c) for c in contexts], np.int32)
        key, turn_key = jax.random.split(key)
        actions = np.asarray(act(params, tokens, lengths, turn_key))
        for row, env in enumerate(envs):
            obs, _, finished, _ = env.step(tokenizer.decode([int(actions[row])]))
            contexts[row] = contexts[row] + [int(actions[row])] + ([] if finished else tokenizer.observation(obs, first=False))
            if finished or len(contexts[row]) >= model.max_len:
                done += 1
                contexts[row] = _reset(env, tokenizer, random.Random(int(rng.integers(1 << 30))))
    return {"run": f"in-process floor ({batch} episodes, one call a turn)",
            "episodes_per_s": done / (time.perf_counter() - start)}


def _reset(env, tokenizer, rng) -> list[int]:
    return tokenizer.start() + tokenizer.observation(env.reset(env.task(rng)), first=True)


def tandem(spec, seconds: float, actor_cores: set[int]) -> dict:
    """Episodes/s of one real actor process, taken by the learner's side of the buffer."""
    from distributed import Client

    from learner.model import init_params
    from tasks.actors.actor import ActorSetup
    from tasks.actors.pool import ActorPool
    from tasks.buffer.channels import Channels
    from tasks.buffer.exchange import Exchange
    from tasks.buffer.reader import BufferReader
    from tasks.runtime.session.build import intake_rules
    from tasks.runtime.session.weights import HttpTransport, WeightSource

    import jax

    with actor_pool(actor_cores) as address, Client(address) as client:
        connect_workers(client)
        channels = Channels(uuid.uuid4().hex[:8])
        rules = intake_rules(spec, log=lambda _: None)
        weights = WeightSource(HttpTransport(channels, client), interval=1).start()
        reader = BufferReader(rules, weights, prefetch=4 * spec.learner.batch_groups)
        exchange = Exchange(channels, client, rules, reader, capacity=spec.buffer.capacity).start()
        weights.publish(jax.device_get(init_params(spec.model, 0)), new_version=False)
        pool = ActorPool(client, ActorSetup(channels, spec.env, spec.actors, spec.buffer, spec.model, 0),
                         spec.actors.workers, log=lambda _: None)
        pool.start()
        try:
            return _count(reader, rules, spec, seconds)
        finally:
            exchange.stop()
            pool.stop(timeout_s=30)
            exchange.release()
            weights.stop()


def _count(reader, rules, spec, seconds: float) -> dict:
    """Takes groups as they come; episodes played (taken or filtered) per second after a warm-up."""
    def played() -> int:
        accounting = rules.accounting()
        return (accounting["consumed"] + accounting["excluded"].get("filtered", 0)) * spec.actors.group_size

    deadline, counted = time.perf_counter() + 30 + seconds, None
    while time.perf_counter() < deadline:
        reader.take(1)
        if counted is None and played() > 4000:  # warm: compiled, the engine full
            counted, start, deadline = played(), time.perf_counter(), time.perf_counter() + seconds
    return {"run": f"tandem actor ({spec.actors.groups_per_worker} groups at once, {spec.actors.slots} slots)",
            "episodes_per_s": (played() - counted) / (time.perf_counter() - start)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--set", action="append", default=[])
    parser.add_argument("--part", choices=["floor"], help=argparse.SUPPRESS)  # the floor's own process
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("results") / "actor_throughput.json")
    args = parser.parse_args()
    from flows.spec import load_spec

    spec = load_spec(ROOT / SPEC, ["actors.workers=1", *args.set])
    if args.part == "floor":
        print(json.dumps(floor(spec, args.batch, args.seconds)))
        return
    _, actor_cores = split_cores()
    rows = [_floor_pinned(args, actor_cores), tandem(spec, args.seconds, actor_cores)]
    rows[1]["x floor"] = rows[1]["episodes_per_s"] / rows[0]["episodes_per_s"]
    emit(f"episodes/s on one actor core: {SPEC}, latency off", rows, args.out, args=vars(args) | {"out": str(args.out)})


def _floor_pinned(args, cores: set[int]) -> dict:
    """The floor in a process of its own on the actor's core, with an actor's XLA settings."""
    from tasks.actors.cluster import ACTOR_ENV

    command = ["taskset", "-c", ",".join(map(str, sorted(cores))), sys.executable, __file__, "--part", "floor",
               "--seconds", str(args.seconds), "--batch", str(args.batch), *[a for s in args.set for a in ("--set", s)]]
    env = {**os.environ, **ACTOR_ENV, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "benchmarks")])}
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
