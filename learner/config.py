"""Configuration of the learner side: model, tokenizer, optimizer, loss, mesh.

Frozen pydantic models; `flows.spec.Spec` composes them into the experiment spec.
"""

from __future__ import annotations

import string
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, field_validator, model_validator

# Printable ASCII without the vertical tab and form feed, which no environment needs.
PRINTABLE_ASCII = string.digits + string.ascii_letters + string.punctuation + " \n\t"


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
            raise ValueError("path: a tokenizer of kind 'hf' needs the directory of its tokenizer.json")
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
        from learner.hf import checkpoint_fields  # here: learner.hf -> learner.model -> this module

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


class OptimizerConfig(Frozen):
    """Adam(W) with global-norm gradient clipping."""

    lr: float = Field(3e-4, gt=0)
    b1: float = Field(0.9, ge=0, lt=1)
    b2: float = Field(0.99, ge=0, lt=1)
    eps: float = Field(1e-8, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    max_grad_norm: float | None = Field(1.0, gt=0)


class LossConfig(Frozen):
    """Group-relative advantages and a token-level clipped policy objective."""

    normalize_std: bool = True  # False: Dr. GRPO (advantage = reward - group mean)
    clip_low: float = Field(0.2, ge=0)  # ratio clipped to [1 - clip_low, 1 + clip_high]
    clip_high: float = Field(0.2, ge=0)
    aggregation: Literal["token-mean", "sequence-mean"] = "token-mean"


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
    steps: PositiveInt = 200
    batch_groups: PositiveInt = 4  # groups per learner step
    optimizer: OptimizerConfig = OptimizerConfig()
    loss: LossConfig = LossConfig()
    mesh: MeshConfig = MeshConfig()
    buckets: tuple[PositiveInt, ...] = (64, 128)  # padded sequence lengths, one compile each
    # "sync": the baseline that waits: generate a batch with the latest weights, train on
    # it, publish, repeat (publishes every step; needs sync.interval 1).
    mode: Literal["async", "sync"] = "async"

    @field_validator("buckets")
    @classmethod
    def _sorted_buckets(cls, buckets: tuple[int, ...]) -> tuple[int, ...]:
        if not buckets:
            raise ValueError("at least one bucket length is needed")
        if list(buckets) != sorted(set(buckets)):
            raise ValueError("bucket lengths must be strictly increasing")
        return buckets
