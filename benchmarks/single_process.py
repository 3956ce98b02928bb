"""The floor for the cost of decoupling: sampling and training in one process, no Dask or Prefect.

Same model, same GRPO batch, same environment code as `tandem run`; prints the success
curve and the wall time to the target. Usage:

    python benchmarks/single_process.py specs/guess-number.yaml [--set path=value ...] [--target 0.9]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import jax
import numpy as np

from flows.spec import load_spec
from learner.batching import batch_of_groups
from learner.sharding import make_mesh
from learner.train import TrainStep, init_train_state, params_numpy
from tasks.buffer.prompts import PromptSource
from tasks.actors.envs import resolve_entrypoint
from tasks.buffer.filters import resolve_filter
from tasks.actors.rollout import GroupRunner


async def collect(runner, source, filters, n, params, version, key, seed):
    """`n` groups that pass the entry checks, and the success rate of all groups made."""
    groups, outcomes = [], []
    while len(groups) < n:
        prompts = [source.next() for _ in range(n - len(groups))]
        keys = [jax.random.fold_in(jax.random.fold_in(key, p.id), p.attempt) for p in prompts]
        made = [await runner.run(p.id, p.text, p.attempt, params, version, k) for p, k in zip(prompts, keys)]
        made = [g for g in made if not g.aborted]
        outcomes += [s.success for g in made for s in g.samples if s.success is not None]
        groups += [g for g in made if all(f(g) for f in filters)]
    return groups, float(np.mean(outcomes)) if outcomes else 0.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("spec")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--window", type=int, default=5, help="steps averaged for the target")
    args = parser.parse_args()
    spec = load_spec(args.spec, args.overrides)
    env_class = resolve_entrypoint(spec.env.entrypoint)
    runner = GroupRunner.build(env_class, spec.env, spec.actors, spec.model)
    source = PromptSource(spec.data, env_class, spec.env.kwargs, spec.seed)
    filters = [resolve_filter(f) for f in spec.buffer.filters]
    mesh = make_mesh(spec.learner.mesh)
    state = init_train_state(spec.model, spec.learner, seed=spec.seed, mesh=mesh)
    train_step = TrainStep(spec.model, spec.learner, mesh)
    key, version = jax.random.PRNGKey(spec.seed), 0
    params = jax.device_put(params_numpy(state))
    start, curve = time.perf_counter(), []
    for step in range(1, spec.learner.steps + 1):
        groups, success = asyncio.run(
            collect(runner, source, filters, spec.learner.batch_groups, params, version, key, spec.seed))
        state, metrics = train_step(state, batch_of_groups(groups, spec.learner))
        curve.append({"step": step, "time": time.perf_counter() - start, "success": success,
                      "entropy": metrics["entropy"]})
        if step % spec.sync.interval == 0:
            version += 1
            params = jax.device_put(params_numpy(state))
        recent = np.mean([c["success"] for c in curve[-args.window:]])
        if step % 10 == 0:
            print(f"step {step} t={curve[-1]['time']:.1f}s success(last {args.window}) {recent:.2f} entropy {metrics['entropy']:.2f}", flush=True)
        if len(curve) >= args.window and recent >= args.target:
            print(json.dumps({"target": args.target, "step": step, "seconds": curve[-1]["time"]}))
            return
    print(json.dumps({"target": args.target, "step": None, "seconds": None}))


if __name__ == "__main__":
    main()
