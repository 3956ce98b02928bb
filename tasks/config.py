"""Configuration of the acting side: environment, data, actors, buffer, sync, checkpoint.

Frozen pydantic models; `flows.spec.Spec` composes them into the experiment spec.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (Field, NonNegativeFloat, PositiveFloat, PositiveInt, field_validator,
                      model_validator)

from learner.config import FieldError, Frozen, OptimizerConfig, cluster_placement

class EnvConfig(Frozen):
    """The environment: a built-in name or "package.module:Class", constructed as Class(**kwargs)."""

    entrypoint: str = "guess-number"
    kwargs: dict[str, Any] = {}
    max_turns: PositiveInt = 4  # an episode still running after this many turns is aborted
    latency_s: NonNegativeFloat = 0.0  # mean delay added before every env step (simulates slow tools)
    # fixed: latency_s every step; uniform: U(0, 2·latency_s); exponential: mean latency_s
    latency_dist: Literal["fixed", "uniform", "exponential"] = "fixed"
    episode_timeout_s: PositiveFloat = 30.0  # a group taking longer is aborted
    step_timeout_s: PositiveFloat | None = None  # one env call (reset or step) taking longer aborts the group


class WarmupConfig(Frozen):
    """Supervised fine-tuning on demonstrations before RL (`tasks.warmup`): the same model,
    mesh, buckets and checkpoints as the learner; its last checkpoint is RL's version 0.

    source: "env", the environment's expert (`demonstration(prompt)`, README
      "Environments") on `examples` prompts drawn from the run's seed; or a .jsonl file,
      one {"observations": [...], "actions": [...]} per line (an action answers the
      observation before it).
    """

    source: str = "env"
    examples: PositiveInt = 4096  # "env": distinct demonstrations, visited in a new order each epoch
    steps: PositiveInt = 100  # optimizer updates
    batch: PositiveInt = 32  # demonstrations an update
    rows: PositiveInt | None = None  # rows they are packed into (learner.buckets' lengths); None: one each
    optimizer: OptimizerConfig = OptimizerConfig(lr=1e-3)
    checkpoint_every: PositiveInt = 25  # updates between checkpoints (and at the last)


class DataConfig(Frozen):
    """Where prompts come from: the environment's own `task(rng)`, or a JSONL file."""

    source: str = "env"  # "env" or a path to a .jsonl file with one {"prompt": ...} per line


class ActorsConfig(Frozen):
    """The actors: Dask worker processes, each running one actor task that plays up to
    `groups_per_worker` groups at once through one batched generation engine of `slots`
    decode slots."""

    cluster: str = "local"  # "local" (a LocalCluster of processes), "tcp://host:8786", or "module:Class"
    workers: PositiveInt = 1  # actor processes: Dask workers, one actor task each
    # Groups each actor process plays at once; named `actors` until renamed (a spec may
    # still use that name: `flows.spec.RENAMED`).
    groups_per_worker: PositiveInt = 16
    slots: PositiveInt = 128  # decode slots of each process's engine: episodes generating together
    group_size: int = Field(8, ge=2)  # episodes per prompt (the GRPO group)
    max_new_tokens: PositiveInt = 16  # tokens per action (one turn of the agent)
    temperature: PositiveFloat = 1.0
    top_k: int = Field(0, ge=0)  # 0: all tokens
    top_p: float = Field(1.0, gt=0, le=1)
    # What a version published mid-episode does: retract (switch weights, recompute the
    # cache, go on), finish (keep the old weights to the end), abort (drop the group).
    on_sync: Literal["retract", "finish", "abort"] = "retract"
    sync_check_tokens: PositiveInt = 16  # decoded tokens between checks of the published version
    # The engine's KV cache: None holds it in the model's compute dtype; "bfloat16" under
    # float32 weights halves its memory and what a decode step's attention reads (vLLM's
    # `kv_cache_dtype`), the learner still scoring every token in float32.
    kv_cache_dtype: Literal["float32", "bfloat16"] | None = None

    # A cluster class ("dask_jobqueue:SLURMCluster", "dask_kubernetes.operator:KubeCluster")
    # is built as Class(**cluster_kwargs) and scaled to `workers`.
    cluster_kwargs: dict[str, Any] = {}
    # Dask worker resources each actor holds for the whole session, e.g. {GPU: 1}: actors run
    # only on workers started with them (`dask worker --resources GPU=1`), and their engine on
    # that worker's default JAX device. A local cluster gives each worker these resources and
    # leaves JAX its default platform; without them, its actors run on CPU.
    resources: dict[str, PositiveFloat] = {}
    # Memory of each worker of the local cluster, past which Dask's nanny restarts it (a
    # leaking environment): a size ("4GiB"), or a fraction of the machine's memory shared
    # by the workers (0.5: half of it, split among them). None: 0.5, leaving the learner and
    # the system the rest. Dask's own default gives each worker all of it.
    memory_limit: str | float | None = None

    @field_validator("cluster")
    @classmethod
    def _cluster(cls, cluster: str) -> str:
        return cluster_placement(cluster)

    @field_validator("memory_limit", mode="before")
    @classmethod
    def _memory_limit(cls, limit: Any) -> str | float | None:
        if isinstance(limit, bool) or not isinstance(limit, (str, int, float, type(None))):
            raise ValueError(f"a size such as \"4GiB\", or a fraction of the machine's memory such as 0.5, "
                             f"not {limit!r}")
        if isinstance(limit, str):
            from dask.utils import parse_bytes  # the parser Dask applies to it

            try:
                size = parse_bytes(limit)
            except ValueError:
                raise ValueError(f"{limit!r} is not a size; use one such as \"4GiB\" or \"500MB\", "
                                 "or a fraction of the machine's memory such as 0.5") from None
            if size <= 0:
                raise ValueError(f"must be more than 0 bytes, not {limit!r}")
        elif limit is not None and not 0 < limit <= 1:
            raise ValueError(f"a fraction of the machine's memory is in (0, 1], not {limit}; "
                             "for a size, write its unit (\"4GiB\")")
        return limit

    @model_validator(mode="after")
    def _memory_limit_is_the_local_clusters(self) -> "ActorsConfig":
        if self.memory_limit is not None and self.cluster != "local":
            raise FieldError("memory_limit", "applies to the local cluster only; give another cluster's "
                             "workers theirs where they start (`dask worker --memory-limit 4GiB`, "
                             "or a cluster class's cluster_kwargs, e.g. memory: 16GB)")
        return self

    @property
    def groups_at_once(self) -> int:
        """Groups played at once over all actor processes."""
        return self.workers * self.groups_per_worker


class BufferConfig(Frozen):
    capacity: PositiveInt = 16  # groups the learner holds ahead; then producers block (backpressure)
    max_staleness: int | None = Field(None, ge=0)  # None: the exit check is off
    filters: tuple[str, ...] = ("zero_variance",)  # entry filters: built-in name or "module:function"
    retry: tuple[Literal["aborted", "stale"], ...] = ("aborted", "stale")
    max_retries: int = Field(3, ge=0)  # per prompt; after that its exclusion is final
    # AReaL-style admission control: start no group that would be taken with a staleness
    # above max_staleness (needs max_staleness).
    admission: bool = False
    # A group up to this size travels inside the queue, through the Dask scheduler (one
    # message to the learner, nothing to lose with the actor's worker); a larger one stays
    # on its actor's worker as a future, which the learner fetches from there.
    inline_bytes: int = Field(64 * 1024, ge=0)

    @model_validator(mode="after")
    def _admission_needs_budget(self) -> "BufferConfig":
        if self.admission and self.max_staleness is None:
            raise FieldError("admission", "needs buffer.max_staleness (the staleness budget)")
        return self


class SyncConfig(Frozen):
    interval: PositiveInt = 4  # learner steps per published version


class CheckpointConfig(Frozen):
    dir: str | None = None  # the run directory; None: runs/<name>
    keep: PositiveInt | None = 3  # checkpoints kept; None keeps all
    every: PositiveInt = 1  # versions between checkpoints (each checkpoint is recorded in Prefect)


class EvalConfig(Frozen):
    """Evaluation of versions on held-out prompts, on the actors' Dask cluster (beside the
    actors, never in the learner's way).

    Attributes:
      every: versions between evaluations during training (the last version is evaluated
        too); None: none during training (`tandem eval` still evaluates checkpoints).
      prompts: "env": the first `n` distinct tasks of the environment drawn from a seed
        stream of their own (`seed`), or a .jsonl of {"prompt": ...} (all its distinct
        prompts).
      held_out: training never draws an eval prompt (`tasks.buffer.prompts`). False suits
        an environment whose agent never sees its task, where a held-out task measures
        nothing but what reward never reached: guess-number's task is the hidden letter,
        and a letter held out is one no episode was ever rewarded for finding (its greedy
        success is 0%); its eval then plays every letter, as training does.
      n: prompts drawn from the environment (prompts "env").
      seed: the eval stream's seed (disjoint from training's whatever its value).
      decoding: greedy (the likeliest token: deterministic) or sampled (`temperature`).
      k: episodes per prompt; sampled with k > 1 reports pass@k (Chen et al. 2021).
      temperature: of sampled decoding.
      slots: decode slots of the eval's engine; None: actors.slots, so that it shares the
        shapes the actor's engine compiled in the same process: a greedy eval compiles
        nothing new (a sampled one its decode, unless its temperature is the actors').
      retries: Prefect retries of a failed evaluation (a failure never fails training).
      resources: Dask worker resources an evaluation holds while it plays, e.g. {eval: 1}:
        evaluations then run only on workers started with them (`dask worker ADDRESS
        --resources eval=1`, say on the learner host's spare cores), off the actors' CPU;
        give the actors a resource of their own too (`actors.resources`) to keep them off
        those workers. {}: any worker, beside an actor. Needs a cluster of such workers
        (`actors.cluster` an address or a cluster class), not the local one.
    """

    every: PositiveInt | None = None
    prompts: str = "env"
    held_out: bool = True
    n: PositiveInt = 16
    seed: int = 0
    decoding: Literal["greedy", "sampled"] = "greedy"
    k: PositiveInt = 1
    temperature: PositiveFloat = 1.0
    slots: PositiveInt | None = None
    retries: int = Field(2, ge=0)
    resources: dict[str, PositiveFloat] = {}

    @model_validator(mode="after")
    def _greedy_is_one_sample(self) -> "EvalConfig":
        if self.decoding == "greedy" and self.k != 1:
            raise FieldError("k", "greedy decoding plays each prompt once (k: 1); use decoding: sampled for pass@k")
        return self

    def due(self, version: int) -> bool:
        """Whether training evaluates `version` on its way (the last one is evaluated too)."""
        return self.every is not None and version > 0 and version % self.every == 0


class EpisodesConfig(Frozen):
    """Episodes kept as text for people (`RUN_DIR/episodes/`, `tandem show`).

    Attributes:
      per_version: training episodes kept per version (the eval keeps all of its own).
      max_mb: the training samples' budget; the oldest versions' files go first.
    """

    per_version: int = Field(4, ge=0)
    max_mb: PositiveFloat = 20.0
