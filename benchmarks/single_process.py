"""The floor: a synchronous GRPO loop in one process, no Dask or Prefect.

The same model, environment code, batch, loss and optimizer as `tandem run` of the spec:
each step plays `learner.batch_groups` groups at once through one batched engine (every
episode of the batch in one decode call), trains on those that pass the entry filters,
and loads the new weights into the engine. It prints the success curve and the wall time
from the first step to the target (the mean success of the finished groups over the last
`--window` steps), as `tandem run` records it. Usage:

    python benchmarks/single_process.py specs/guess-number.yaml [--set path=value ...] [--target 0.9]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import numpy as np

from flows.spec import load_spec
from learner.batching import batch_of_groups
from learner.sharding import make_mesh
from learner.train import TrainStep, init_train_state, params_numpy
from tasks.actors.envs import resolve_entrypoint
from tasks.actors.generation import local_generation
from tasks.actors.rollout import GroupRunner
from tasks.buffer.filters import resolve_filter
from tasks.buffer.prompts import PromptSource


async def play(runner, prompts, envs) -> list:
    return await asyncio.gather(*(runner.run(p.id, p.text, p.attempt, e) for p, e in zip(prompts, envs)))


def collect(runner, source, filters, envs, n) -> tuple[list, list]:
    """`n` groups that pass the entry checks, and the success of every episode played."""
    kept, outcomes = [], []
    while len(kept) < n:
        made = asyncio.run(play(runner, [source.next() for _ in range(n - len(kept))], envs))
        made = [g for g in made if not g.aborted]
        outcomes += [s.success for g in made for s in g.samples if s.success is not None]
        kept += [g for g in made if all(f(g) for f in filters)]
    return kept, outcomes


def train(spec, target: float, window: int, budget_s: float, log_every: int = 10) -> dict:
    env_class = resolve_entrypoint(spec.env.entrypoint)
    source = PromptSource(spec.data, env_class, spec.env.kwargs, spec.seed)
    filters = [resolve_filter(f) for f in spec.buffer.filters]
    envs = [[env_class(**spec.env.kwargs) for _ in range(spec.actors.group_size)]
            for _ in range(spec.learner.batch_groups)]
    mesh = make_mesh(spec.learner.mesh)
    state = init_train_state(spec.model, spec.learner, seed=spec.seed, mesh=mesh)
    train_step = TrainStep(spec.model, spec.learner, mesh)
    actors = spec.actors.model_copy(update={"slots": spec.learner.batch_groups * spec.actors.group_size})
    curve, start = [], None
    with local_generation(spec.model, actors, params_numpy(state)) as service:
        runner = GroupRunner.build(service, spec.env, actors, spec.model, spec.seed)
        for step in range(1, spec.learner.steps + 1):
            groups, outcomes = collect(runner, source, filters, envs, spec.learner.batch_groups)
            for state, metrics in train_step.updates(state, batch_of_groups(groups, spec.learner)):
                pass
            service.load(step, params_numpy(state))
            start = start or time.perf_counter()  # from the end of the first step, as `tandem run` counts
            curve.append({"step": step, "time": time.perf_counter() - start,
                          "success": float(np.mean(outcomes)) if outcomes else 0.0, "entropy": metrics["entropy"]})
            recent = float(np.mean([c["success"] for c in curve[-window:]]))
            if step % log_every == 0:
                print(f"step {step} t={curve[-1]['time']:.1f}s success(last {window}) {recent:.2f} "
                      f"entropy {metrics['entropy']:.2f}", flush=True)
            if len(curve) >= window and recent >= target:
                return {"target": target, "step": step, "seconds": curve[-1]["time"]}
            if curve[-1]["time"] > budget_s:
                break
    return {"target": target, "step": None, "seconds": None}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("spec")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--window", type=int, default=20, help="steps averaged for the target")
    parser.add_argument("--seconds", type=float, default=480.0, help="budget after the first step")
    args = parser.parse_args()
    spec = load_spec(args.spec, args.overrides)
    print(json.dumps(train(spec, args.target, args.window, args.seconds)))


if __name__ == "__main__":
    main()
