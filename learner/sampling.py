"""How a token is drawn from the model's logits: temperature, top-k and top-p.

The log-prob an actor records for a token is that of the distribution it was actually
drawn from (after the filters): the behaviour policy the loss corrects for. Generation
itself is `learner.engine`.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How a token is drawn from the model's logits (hashable: a jit static argument).

    temperature: logits are divided by it (> 0); top_k: keep the k likeliest tokens
    (0 = all; 1 = greedy); top_p: keep the smallest set whose probability reaches p.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self):
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature} (top_k=1 is greedy)")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


def sampling_logprobs(logits_bv: jax.Array, sampling: SamplingParams) -> jax.Array:
    """Log-probs [B, V] of the distribution tokens are drawn from; filtered tokens get -inf.

    Args:
      logits_bv: float32 [B, V] next-token logits.
      sampling: temperature, top-k and top-p (nucleus, Holtzman et al. 2019).

    Returns:
      float32 [B, V] log-probs, normalised over the tokens that survive the filters.
    """
    logits = logits_bv.astype(jnp.float32) / sampling.temperature
    if 0 < sampling.top_k < logits.shape[-1]:
        kth = jax.lax.top_k(logits, sampling.top_k)[0][:, -1:]
        logits = jnp.where(logits < kth, -jnp.inf, logits)
    if sampling.top_p < 1:
        sorted_desc = -jnp.sort(-logits, axis=-1)
        probs = jax.nn.softmax(sorted_desc, axis=-1)
        # A token stays if the tokens likelier than it have not yet reached top_p.
        before = jnp.cumsum(probs, axis=-1) - probs
        cutoff = jnp.min(jnp.where(before < sampling.top_p, sorted_desc, jnp.inf), axis=-1, keepdims=True)
        logits = jnp.where(logits < cutoff, -jnp.inf, logits)
    return jax.nn.log_softmax(logits, axis=-1)
