"""Configuration of the learner side: model, tokenizer, optimizer, loss, mesh.

Frozen pydantic models; `flows.spec.Spec` composes them into the experiment spec.
"""

from __future__ import annotations

import string
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt, field_validator, model_validator

from learner.hf_config import checkpoint_fields

# Printable ASCII without the vertical tab and form feed, which no environment needs.
PRINTABLE_ASCII = string.digits + string.ascii_letters + string.punctuation + " \n\t"


def cluster_placement(cluster: str) -> str:
    """A `cluster` field's value (the learner's or the actors'), checked: "local", a
    scheduler address, or a cluster class as "module:Class"."""
    if cluster != "local" and "://" not in cluster and ":" not in cluster:
        raise ValueError('must be "local", a scheduler address such as "tcp://host:8786", '
                         'or a cluster class such as "dask_jobqueue:SLURMCluster"')
    return cluster


class FieldError(ValueError):
    """A check that names the field at fault: `path`, relative to the model it validates (or
    from the spec's root, for the spec's own checks), beside what is wrong with it. The spec's
    loader puts the issue at that field and its YAML line, reading `path`, never the text."""

    def __init__(self, path: str, message: str):
        self.path, self.message = path, message
        super().__init__(f"{path}: {message}")


class Frozen(BaseModel):
    """Base of every spec section: immutable, unknown keys rejected."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class TokenizerConfig(Frozen):
    """Text <-> token ids: a character tokenizer over a declared alphabet (ids 0..2 are
    pad, bos, eos), or a Hugging Face `tokenizer.json` with its chat template."""

    kind: Literal["char", "hf"] = "char"
    alphabet: str = PRINTABLE_ASCII  # kind "char" only
    path: str | None = None  # kind "hf": the checkpoint directory holding tokenizer.json

    @model_validator(mode="after")
    def _hf_needs_path(self) -> "TokenizerConfig":
        if self.kind == "hf" and self.path is None:
            raise FieldError("path", "a tokenizer of kind 'hf' needs the directory of its tokenizer.json")
        return self

    @field_validator("alphabet")
    @classmethod
    def _unique_chars(cls, alphabet: str) -> str:
        if not alphabet:
            raise ValueError("alphabet must not be empty")
        repeated = sorted({c for c in alphabet if alphabet.count(c) > 1})
        if repeated:
            raise ValueError(f"alphabet repeats characters {repeated!r}")
        return alphabet


class ModelConfig(Frozen):
    """A decoder-only transformer of the Llama/Qwen2 family."""

    init: str = "random"  # "random" or a Hugging Face checkpoint directory (sizes then come from it)
    d_model: PositiveInt = 64
    n_layers: PositiveInt = 2
    n_heads: PositiveInt = 4
    n_kv_heads: PositiveInt = 2
    d_ff: PositiveInt = 256
    max_len: PositiveInt = 64  # context length: the longest episode, prompt included
    rope_theta: float = Field(10_000.0, gt=0)
    norm_eps: float = Field(1e-6, gt=0)
    tie_embeddings: bool = True
    qkv_bias: bool = False  # Qwen2 adds biases to the query, key and value projections
    vocab: PositiveInt | None = None  # embedding rows; None: the char tokenizer's vocabulary
    dtype: Literal["float32", "bfloat16"] = "float32"
    tokenizer: TokenizerConfig = TokenizerConfig()

    @model_validator(mode="before")
    @classmethod
    def _checkpoint_sizes(cls, data):
        """With `init` a checkpoint directory, sizes default to those in its config.json
        and the tokenizer to its tokenizer.json; sizes given explicitly must agree."""
        init = data.get("init", "random") if isinstance(data, dict) else "random"
        if not isinstance(init, str) or init == "random":
            return data  # a non-string init is reported by the field's own validation
        return checkpoint_fields(data["init"], given=data)

    @model_validator(mode="after")
    def _heads_divide(self) -> "ModelConfig":
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must be divisible by n_kv_heads ({self.n_kv_heads})")
        return self

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def vocab_size(self) -> int:
        return self.vocab if self.vocab is not None else 3 + len(self.tokenizer.alphabet)

    def kv_bytes_per_position(self, cache_dtype: str | None = None) -> int:
        """Bytes of keys and values one cached position holds, over all layers, in
        `cache_dtype` (None: the model's `dtype`, as the engine's cache is by default)."""
        itemsize = 4 if (cache_dtype or self.dtype) == "float32" else 2
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * itemsize


class OptimizerConfig(Frozen):
    """Adam(W) with global-norm gradient clipping, at a constant `lr` or on a schedule.

    warmup_steps: the learning rate rises linearly to `lr` over the first updates (update k,
      from 0, at lr * (k + 1) / warmup_steps; Goyal et al. 2017, the usual start of
      transformer training). 0 = none.
    decay_steps: after the warm-up, a cosine decay (Loshchilov & Hutter 2017) from `lr` to
      `lr * min_lr_ratio` over this many updates, then constant; None = `lr` throughout.
    """

    lr: float = Field(3e-4, gt=0)
    b1: float = Field(0.9, ge=0, lt=1)
    b2: float = Field(0.99, ge=0, lt=1)
    eps: float = Field(1e-8, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    max_grad_norm: float | None = Field(1.0, gt=0)
    warmup_steps: int = Field(0, ge=0)
    decay_steps: PositiveInt | None = None
    min_lr_ratio: float = Field(0.1, ge=0, le=1)

    @property
    def scheduled(self) -> bool:
        """Whether the learning rate changes with the update count (a count in the optimizer's state)."""
        return self.warmup_steps > 0 or self.decay_steps is not None


class LossConfig(Frozen):
    """Group-relative advantages and a token-level clipped policy objective.

    objective: where the clip is centred and which importance weight multiplies it
      (see `learner.losses.policy_loss`):
      "ppo": around the behaviour policy that sampled the tokens (the actors').
      "tis": truncated importance sampling: the clip is trivial (centred on the
        current policy) and each token is weighted by min(pi / mu, is_cap).
      "decoupled-ppo": around a proximal policy (the learner's weights when the
        batch's first update starts), weighted by min(pi_prox / mu, is_cap).
      "supervised": the negative log-likelihood of the trained tokens, advantages and
        behaviour log-probs unused: a warm-up's fine-tuning on demonstrations (`warmup`).
    is_cap: truncation of the behaviour importance weights; None = untruncated.
    kl_coef: weight of a KL penalty to the initial policy (0 = off; > 0 keeps a
      frozen copy of the initial parameters in the train state).
    entropy_coef: weight of an entropy bonus on the trained tokens (0 = off), against
      the entropy collapse of small policies (Mnih et al. 2016).
    clip_high above clip_low is DAPO's clip-higher (Yu et al. 2025): a token the policy
      rarely samples may gain more than a likely one may lose, which keeps entropy up.
    """

    normalize_std: bool = True  # False: Dr. GRPO (advantage = reward - group mean)
    clip_low: float = Field(0.2, ge=0)  # ratio clipped to [1 - clip_low, 1 + clip_high]
    clip_high: float = Field(0.2, ge=0)
    aggregation: Literal["token-mean", "sequence-mean"] = "token-mean"
    objective: Literal["ppo", "tis", "decoupled-ppo", "supervised"] = "ppo"
    is_cap: float | None = Field(None, gt=0)
    kl_coef: float = Field(0.0, ge=0)
    entropy_coef: float = Field(0.0, ge=0)

    @model_validator(mode="after")
    def _cap_has_a_weight_to_cap(self) -> "LossConfig":
        if self.is_cap is not None and self.objective in ("ppo", "supervised"):
            raise FieldError(
                "is_cap", f"objective {self.objective!r} has no importance weight to truncate"
                + (" (its clip is around the behaviour policy)" if self.objective == "ppo" else "")
                + "; use 'tis' or 'decoupled-ppo'"
            )
        return self


class MeshConfig(Frozen):
    """Device mesh axes; -1 takes the devices the other axes leave."""

    data: int = -1
    fsdp: PositiveInt = 1
    tensor: PositiveInt = 1

    @field_validator("data")
    @classmethod
    def _data_axis(cls, data: int) -> int:
        if data == 0 or data < -1:
            raise ValueError("must be a positive device count or -1 (the remaining devices)")
        return data


class LearnerConfig(Frozen):
    """The learner: batch size and shape, optimizer, loss, mesh and hosts.

    One batch (`batch_groups` groups) yields `minibatches * epochs` steps, each one
    optimizer update on a `rows / minibatches` slice of its rows.
    """

    steps: PositiveInt = 200
    batch_groups: PositiveInt = 4  # groups per batch
    optimizer: OptimizerConfig = OptimizerConfig()
    loss: LossConfig = LossConfig()
    mesh: MeshConfig = MeshConfig()
    buckets: tuple[PositiveInt, ...] = (64, 128)  # padded lengths: 1-3 compiles each (loss_positions)
    rows: PositiveInt | None = None  # rows per batch, samples packed into them; None: one per sample
    minibatches: PositiveInt = 1  # optimizer updates per pass over a batch
    epochs: PositiveInt = 1  # passes over each batch
    # Activation rematerialisation in the train step's backward pass. "none": every
    # block's activations are kept from the forward pass. "block": only each block's
    # input is; its activations are recomputed from it in the backward pass (one more
    # forward pass of the blocks, up to a third more of their FLOPs, for activation
    # memory of the residual stream instead of all of a block's attention and MLP
    # activations; on XLA:CPU almost nothing is saved, see `learner.model`). Values are
    # unchanged, and the actors' sampler, which never differentiates, is unaffected:
    # a learner setting, not the model's.
    remat: Literal["none", "block"] = "none"
    # Processes of the learner (jax.distributed), each feeding its share of every batch's
    # rows from its own devices; process 0 alone runs the buffer, publishing and checkpoints.
    hosts: PositiveInt = 1
    # Where those processes run, each with the devices its environment gives it (XLA_FLAGS
    # on CPU, CUDA_VISIBLE_DEVICES, ...). "local": all on the machine of the learner task.
    # "tcp://host:8786": one on each of `hosts` workers of that Dask scheduler that carry a
    # `learner` resource (`dask worker tcp://host:8786 --resources learner=1 --nthreads 1`).
    # "module:Class" (e.g. "dask_jobqueue:SLURMCluster"): such a cluster, built as
    # Class(**cluster_kwargs) and scaled to `hosts` workers; cluster_kwargs must give its
    # workers the `learner` resource (jobqueue: worker_extra_args: [--resources, learner=1]).
    cluster: str = "local"
    cluster_kwargs: dict[str, Any] = {}
    # "sync": the baseline that waits: generate a batch with the latest weights, train on
    # it, publish, repeat (publishes every step; needs sync.interval 1).
    mode: Literal["async", "sync"] = "async"
    # Stop before `steps` once the acting policy's success rate, averaged over the last
    # `stop_window` steps, reaches this (checked when a version is published); None: never.
    stop_at_success: float | None = Field(None, gt=0, le=1)
    stop_window: PositiveInt = 20
    # A run ends by itself (README, "How a run ends"; `tasks.runtime.session.stopping`). Plateau:
    # the windowed success (reward where none is reported) has not beaten its best by one
    # point for this many steps; None: never.
    plateau_steps: PositiveInt | None = None
    # No learning signal (DAPO's dynamic sampling bound, `max_num_gen_batches`, Yu et al.
    # 2025): while the learner waits for a batch, this many batches' worth of groups finished
    # and none could be trained (all filtered, invalid, aborted or stale), or groups kept
    # finishing untrained for `no_signal_s` seconds. None turns a bound off.
    max_gen_batches: PositiveInt | None = 16
    no_signal_s: PositiveFloat | None = 300.0
    # Then: "stop" ends the run on a checkpoint (exit 3); "fail" fails it (exit 1), for
    # pipelines that must treat it as an error.
    on_no_signal: Literal["stop", "fail"] = "stop"

    @field_validator("buckets")
    @classmethod
    def _sorted_buckets(cls, buckets: tuple[int, ...]) -> tuple[int, ...]:
        if not buckets:
            raise ValueError("at least one bucket length is needed")
        if list(buckets) != sorted(set(buckets)):
            raise ValueError("bucket lengths must be strictly increasing")
        return buckets

    @field_validator("cluster")
    @classmethod
    def _cluster(cls, cluster: str) -> str:
        return cluster_placement(cluster)

    @model_validator(mode="after")
    def _rows_split_into_minibatches(self) -> "LearnerConfig":
        if self.rows is not None and self.rows % self.minibatches:
            raise ValueError(f"rows ({self.rows}) must be divisible by minibatches ({self.minibatches})")
        return self

    @property
    def updates_per_batch(self) -> int:
        return self.minibatches * self.epochs

    def batch_rows(self, samples_per_batch: int) -> int:
        """Rows of every batch: `rows` if set, else one row per sample."""
        return samples_per_batch if self.rows is None else self.rows
