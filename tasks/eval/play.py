"""Playing an evaluation on a Dask worker: the eval's prompts, with the weights of one
version, through the actors' own code path (`tasks.actors.rollout.GroupRunner` over a
continuous-batching engine of `eval.slots` slots), greedy or sampled.

The engine compiles its shapes before the first episode starts (`Engine.warm_up`), so
`eval_s` includes them; beside an actor of the same slots (`eval.slots` null) in its
process, they are compiled already and take milliseconds.

Greedy decoding draws the likeliest token whatever the key, so the eval of fixed weights
is deterministic; sampled decoding is too, for a given `eval.seed` (each action's key
depends only on where it is played).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time

from learner.chat import make_tokenizer
from learner.config import ModelConfig
from learner.engine import Engine
from learner.sampling import SamplingParams
from learner.serialization import params_from_bytes
from learner.trajectory import Group
from tasks.actors.envs import resolve_entrypoint
from tasks.actors.generation import GenerationService, actor_sampling, use_compile_cache
from tasks.actors.rollout import GroupRunner
from tasks.config import ActorsConfig, EnvConfig, EvalConfig
from tasks.eval.scores import score
from tasks.records.episodes import episode_records


@dataclasses.dataclass(frozen=True)
class EvalSetup:
    """Everything an evaluation needs, picklable to any Dask worker."""

    eval: EvalConfig
    env: EnvConfig
    actors: ActorsConfig
    model: ModelConfig
    prompts: tuple[str, ...]

    @property
    def greedy(self) -> bool:
        return self.eval.decoding == "greedy"

    @property
    def sampling(self) -> SamplingParams:
        if self.greedy:  # the likeliest token is drawn whatever the sampling: the actors', whose
            return actor_sampling(self.actors)  # decode the worker has compiled already
        return SamplingParams(temperature=self.eval.temperature)


def play_eval(setup: EvalSetup, params_bytes: bytes, version: int) -> dict:
    """Plays every eval prompt `eval.k` times with `params_bytes` (safetensors, as published);
    returns {"scores": ..., "episodes": [one record per episode]}."""
    start = time.perf_counter()
    use_compile_cache()
    tokenizer = make_tokenizer(setup.model)
    engine = Engine(setup.model, slots=setup.eval.slots or setup.actors.slots, sampling=setup.sampling,
                    stop_ids=tokenizer.stop_ids, check_every=setup.actors.sync_check_tokens, greedy=setup.greedy,
                    kv_cache_dtype=setup.actors.kv_cache_dtype)
    service = GenerationService(engine).start()
    service.load(version, params_from_bytes(params_bytes))
    try:
        # Compiled before any episode's clock starts (`env.episode_timeout_s`): the first
        # evaluation in a process met a new shape at every turn, and timed out.
        service.warm_up(len(setup.prompts) * setup.eval.k)
        runner = GroupRunner.build(service, setup.env, setup.actors, setup.model, seed=setup.eval.seed)
        groups = asyncio.run(_play_all(runner, setup))
    finally:
        service.stop()
    episodes = [record for g in groups for record in episode_records(g, tokenizer)]
    return {"scores": {**score(groups, setup.eval.k), "eval_s": time.perf_counter() - start},
            "episodes": episodes}


async def _play_all(runner: GroupRunner, setup: EvalSetup) -> list[Group]:
    """Every prompt at once, each in `k` environments of its own."""
    env_class = resolve_entrypoint(setup.env.entrypoint)
    envs = [[env_class(**setup.env.kwargs) for _ in range(setup.eval.k)] for _ in setup.prompts]
    return list(await asyncio.gather(*(runner.run(j, prompt, 0, env_set)
                                       for j, (prompt, env_set) in enumerate(zip(setup.prompts, envs)))))
