"""Named model shapes of the Llama and Qwen2 families, at the sizes LLM agents are trained at.

A shape fixes the architecture (`ModelConfig`'s size fields) and how it is written as a
Hugging Face `config.json`; the weights and the tokenizer come from `learner.checkpoint_dir`.
Qwen2 has biases on the query, key and value projections and ties its embeddings at small
sizes; Llama has no biases and an untied output head. `qwen2-500m` and `qwen2-1.5b` are
Qwen2.5-0.5B's and Qwen2.5-1.5B's shapes (Qwen Team 2024, their config.json): 24 layers of
896 with 14 query heads, and 28 layers of 1,536 with 12, over 2 key/value heads, a
vocabulary of 151,936 rows.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal


@dataclasses.dataclass(frozen=True)
class Shape:
    family: Literal["llama", "qwen2"]
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_ff: int
    vocab: int  # embedding rows: at least the tokenizer's ids, often rounded up (Qwen2.5: 151,936)
    tie_embeddings: bool
    rope_theta: float = 1_000_000.0
    norm_eps: float = 1e-6

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def qkv_bias(self) -> bool:
        return self.family == "qwen2"

    def model_fields(self) -> dict[str, Any]:
        """The `ModelConfig` fields this shape sets."""
        return {"d_model": self.d_model, "n_layers": self.n_layers, "n_heads": self.n_heads,
                "n_kv_heads": self.n_kv_heads, "d_ff": self.d_ff, "vocab": self.vocab,
                "tie_embeddings": self.tie_embeddings, "qkv_bias": self.qkv_bias,
                "rope_theta": self.rope_theta, "norm_eps": self.norm_eps}

    def parameters(self) -> int:
        """Parameters, embedding (and an untied output head) included."""
        d, kv = self.d_model, self.n_kv_heads * self.head_dim
        attention = 2 * d * d + 2 * d * kv + (d + 2 * kv) * self.qkv_bias
        layer = attention + 3 * d * self.d_ff + 2 * d
        return self.n_layers * layer + self.vocab * d * (1 + (not self.tie_embeddings)) + d

    def hf_config(self, *, max_len: int, eos_token_id: int, bos_token_id: int | None) -> dict[str, Any]:
        """`config.json` as `transformers` writes it for this family."""
        config = {
            "architectures": ["Qwen2ForCausalLM" if self.family == "qwen2" else "LlamaForCausalLM"],
            "model_type": self.family, "hidden_act": "silu", "hidden_size": self.d_model,
            "intermediate_size": self.d_ff, "num_hidden_layers": self.n_layers,
            "num_attention_heads": self.n_heads, "num_key_value_heads": self.n_kv_heads,
            "vocab_size": self.vocab, "max_position_embeddings": max_len, "rms_norm_eps": self.norm_eps,
            "rope_theta": self.rope_theta, "tie_word_embeddings": self.tie_embeddings,
            "eos_token_id": eos_token_id, "bos_token_id": bos_token_id, "torch_dtype": "float32",
            "initializer_range": 0.02, "attention_dropout": 0.0, "use_cache": True,
        }
        if self.family == "llama":
            config |= {"attention_bias": False, "mlp_bias": False, "head_dim": self.head_dim}
        else:
            config |= {"use_sliding_window": False, "sliding_window": None, "max_window_layers": self.n_layers}
        return config


_VOCAB = 32_768  # the tokenizer `learner.bpe` trains by default

SHAPES: dict[str, Shape] = {
    "qwen2-25m": Shape("qwen2", 384, 8, 6, 2, 1_024, _VOCAB, tie_embeddings=True),
    "qwen2-125m": Shape("qwen2", 768, 12, 12, 4, 3_072, _VOCAB, tie_embeddings=True),
    "qwen2-500m": Shape("qwen2", 896, 24, 14, 2, 4_864, 151_936, tie_embeddings=True),
    "qwen2-1.5b": Shape("qwen2", 1_536, 28, 12, 2, 8_960, 151_936, tie_embeddings=True),
    "llama-25m": Shape("llama", 256, 8, 4, 2, 1_024, _VOCAB, tie_embeddings=False, rope_theta=500_000.0),
    "llama-125m": Shape("llama", 768, 10, 12, 4, 3_072, _VOCAB, tie_embeddings=False, rope_theta=500_000.0),
    "llama-500m": Shape("llama", 1_024, 28, 16, 4, 4_096, _VOCAB, tie_embeddings=False, rope_theta=500_000.0),
}
