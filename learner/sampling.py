"""Autoregressive sampling for actors: batched over a group, fixed shapes, per-token log-probs.

Each decode step runs the model over the whole context window (no KV cache yet), so
the step compiles once per batch size and is cheap for the short episodes of small
models. The log-prob recorded for a token is that of the distribution it was actually
drawn from (logits / temperature).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from learner.config import ModelConfig
from learner.model import forward_fn
from learner.tokenizer import EOS


@functools.partial(jax.jit, static_argnames=("forward",))
def _next_token(forward, params, tokens, lengths, key, temperature):
    """Samples the token after position `lengths - 1` of each row.

    Args:
      tokens: int32 [B, L], each row's context left-aligned and zero-padded.
      lengths: int32 [B], context length of each row (>= 1).
    Returns:
      (tokens [B] int32, logprobs [B] float32).
    """
    batch, length = tokens.shape
    positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
    segment_ids = (positions < lengths[:, None]).astype(jnp.int32)
    logits = forward(params, tokens, positions, segment_ids)
    last = jnp.take_along_axis(logits, (lengths - 1)[:, None, None], axis=1)[:, 0]
    logp = jax.nn.log_softmax(last.astype(jnp.float32) / temperature)
    token = jax.random.categorical(key, logp)
    return token.astype(jnp.int32), jnp.take_along_axis(logp, token[:, None], axis=1)[:, 0]


class Sampler:
    """Generates one action per row of a batch of contexts with fixed-shape jitted steps."""

    def __init__(self, config: ModelConfig):
        self.max_len = config.max_len
        self._forward = forward_fn(config)

    def generate(self, params, contexts: list[list[int]], *, max_new_tokens: int,
                 temperature: float, key: jax.Array) -> tuple[list[list[int]], list[list[float]]]:
        """Samples up to `max_new_tokens` per context, stopping a row at eos or a full window.

        Args:
          params: model parameters (NumPy or JAX pure-dict pytree).
          contexts: token ids of each row; every row must leave room for one token.
        Returns:
          (new tokens of each row, their log-probs).
        """
        rows = len(contexts)
        tokens = np.zeros((rows, self.max_len), np.int32)
        lengths = np.array([len(c) for c in contexts], np.int32)
        if lengths.min() < 1 or lengths.max() >= self.max_len:
            raise ValueError(f"context lengths {lengths.tolist()} leave no room in a window of {self.max_len}")
        for r, context in enumerate(contexts):
            tokens[r, : len(context)] = context
        new = [[] for _ in range(rows)]
        logprobs = [[] for _ in range(rows)]
        active = np.ones(rows, bool)
        for _ in range(max_new_tokens):
            key, step_key = jax.random.split(key)
            token, logp = jax.device_get(
                _next_token(self._forward, params, tokens, lengths, step_key, temperature))
            for r in np.flatnonzero(active):
                new[r].append(int(token[r]))
                logprobs[r].append(float(logp[r]))
                tokens[r, lengths[r]] = token[r]
                lengths[r] += 1
                if token[r] == EOS or lengths[r] >= self.max_len:
                    active[r] = False
            if not active.any():
                break
        return new, logprobs
