"""Autoregressive sampling for actors: a group at a time, over a fixed-size KV cache.

A prompt is prefilled in one jitted call and then each token costs one cached
position (`learner.model.extend_fn`). Shapes are bucketed so compiles stay bounded:
the cache always has `model.max_len` slots, the batch is padded to a power of two
and a prefill to a power-of-two length. The log-prob recorded for a token is that
of the distribution it was actually drawn from (after temperature, top-k, top-p).

With a `refresh` callback the sampler checks the published version every
`check_every` tokens and follows the README's rule for in-flight generation
(`on_sync`): "retract" swaps in the new weights and recomputes the cache over the
tokens so far, "finish" keeps the old weights, "abort" stops and says so. Each
token records the version that generated it.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from typing import Callable, Literal

import jax
import jax.numpy as jnp
import numpy as np

from learner.config import ModelConfig
from learner.model import Extend, KVCache, Params, extend_fn, init_cache
from learner.tokenizer import EOS

OnSync = Literal["retract", "finish", "abort"]
Refresh = Callable[[], tuple[int, Params]]
_MIN_PREFILL = 16  # shortest prefill bucket: shorter prompts cost the same anyway

# Threads that call a jitted function with a new shape at the same time each compile it
# (jit does not wait for a compile in progress): many actors sharing a process would
# compile every new shape once each, concurrently. The first call of each shape holds
# this lock; the others wait for it, then hit the cache.
_compiled: set = set()
_compile_lock = threading.Lock()


def _first_call_alone(key, call):
    if key in _compiled:
        return call()
    with _compile_lock:
        result = call()
        _compiled.add(key)
    return result


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


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DecodeState:
    """Everything a decode step carries; rows are left-aligned in a [B, S] window."""

    tokens: jax.Array  # int32 [B, S] context and generated tokens
    logprobs: jax.Array  # float32 [B, S] log-prob of each generated token (0 elsewhere)
    lengths: jax.Array  # int32 [B] tokens so far
    stop_at: jax.Array  # int32 [B] length at which a row stops (max_new_tokens or a full window)
    done: jax.Array  # bool [B]
    next_logits: jax.Array  # float32 [B, V] logits of each row's next token
    cache: KVCache


@functools.partial(jax.jit, static_argnames=("extend", "prefill_len"), donate_argnames=("state",))
def prefill(extend: Extend, params: Params, state: DecodeState, prefill_len: int) -> DecodeState:
    """Recomputes the cache and next-token logits over each row's tokens with `params`.

    Serves both a new prompt and a retract; positions past a row's length in the
    first `prefill_len` are padding, overwritten before they are ever read.
    """
    batch = state.tokens.shape[0]
    positions = jnp.broadcast_to(jnp.arange(prefill_len, dtype=jnp.int32), (batch, prefill_len))
    logits, cache = extend(params, state.tokens[:, :prefill_len], positions, state.cache, state.lengths - 1)
    return dataclasses.replace(state, next_logits=logits, cache=cache)


@functools.partial(jax.jit, static_argnames=("extend", "sampling"), donate_argnames=("state",))
def decode(extend: Extend, params: Params, state: DecodeState, key: jax.Array, steps: jax.Array,
           stop_ids: jax.Array, sampling: SamplingParams) -> DecodeState:
    """Samples up to `steps` tokens per row (fewer once every row is done).

    Args:
      extend: `extend_fn(config)`.
      key: PRNG key; step i uses `fold_in(key, i)`.
      steps: int32 scalar, traced, so every chunk length shares one compile.
      stop_ids: int32 [K] tokens that end a row (kept, like eos).
      sampling: how tokens are drawn.

    Returns:
      The state after the last step.
    """
    rows = jnp.arange(state.tokens.shape[0])
    window = state.tokens.shape[1]

    def step(carry):
        i, s = carry
        logp = sampling_logprobs(s.next_logits, sampling)
        token = jax.random.categorical(jax.random.fold_in(key, i), logp).astype(jnp.int32)
        active = ~s.done
        slot = jnp.where(active, s.lengths, window)  # out of range: a done row writes nothing
        logits, cache = extend(params, token[:, None], s.lengths[:, None], s.cache, jnp.zeros_like(s.lengths))
        lengths = s.lengths + active
        return i + 1, DecodeState(
            tokens=s.tokens.at[rows, slot].set(token, mode="drop"),
            logprobs=s.logprobs.at[rows, slot].set(logp[rows, token], mode="drop"),
            lengths=lengths, stop_at=s.stop_at,
            done=s.done | (active & jnp.isin(token, stop_ids)) | (lengths >= s.stop_at),
            next_logits=logits, cache=cache)

    def more(carry):
        i, s = carry
        return (i < steps) & ~jnp.all(s.done)

    return jax.lax.while_loop(more, step, (jnp.int32(0), state))[1]


@dataclasses.dataclass(frozen=True)
class Generation:
    """What `Sampler.generate` produced, one entry per context row.

    tokens: int32 [n_i] new tokens of row i (ending with a stop id if it stopped on one).
    logprobs: float32 [n_i] their log-probs under the distribution sampled from.
    versions: int32 [n_i] the weights version that generated each token.
    aborted: True when on_sync="abort" met a newer version; rows then hold the tokens
      generated before it was noticed.
    version: the version of the weights in use at the end (the newest seen under "retract").
    params: those weights, so the caller can keep using them for the next turn.
    """

    tokens: tuple[np.ndarray, ...]
    logprobs: tuple[np.ndarray, ...]
    versions: tuple[np.ndarray, ...]
    aborted: bool
    version: int
    params: Params = dataclasses.field(repr=False)


class Sampler:
    """Generates one action per row of a group with jitted, cached prefill and decode steps."""

    def __init__(self, config: ModelConfig, *, stop_ids: tuple[int, ...] = (EOS,)):
        """Args: config: the policy's model; stop_ids: tokens that end an action (the tokenizer's)."""
        self.config = config
        self.max_len = config.max_len
        self.stop_ids = tuple(stop_ids)
        self._extend = extend_fn(config)

    def generate(self, params: Params, contexts: list[list[int]], *, max_new_tokens: int,
                 temperature: float, key: jax.Array, top_k: int = 0, top_p: float = 1.0,
                 version: int = 0, refresh: Refresh | None = None, check_every: int = 16,
                 on_sync: OnSync = "retract") -> Generation:
        """Samples up to `max_new_tokens` per context; a row stops at a stop id or a full window.

        Args:
          params: weights of `version` (NumPy or JAX pure-dict pytree).
          contexts: token ids of each row; each must leave room for one token.
          max_new_tokens, temperature, top_k, top_p: see `SamplingParams`.
          key: PRNG key.
          version: the version of `params`, recorded on each token they generate.
          refresh: returns the latest published (version, params); called every
            `check_every` decoded tokens unless on_sync is "finish".
          on_sync: what a newer version does mid-generation (module docstring).

        Returns:
          A `Generation`.
        """
        if on_sync not in ("retract", "finish", "abort"):
            raise ValueError(f"on_sync must be retract, finish or abort, got {on_sync!r}")
        if check_every < 1:
            raise ValueError(f"check_every must be >= 1, got {check_every}")
        sampling = SamplingParams(temperature, top_k, top_p)
        checking = refresh is not None and on_sync != "finish"
        chunk = np.int32(check_every if checking else max_new_tokens)
        params = jax.device_put(params)
        state = self._prefill(params, self._initial_state(contexts, max_new_tokens))
        start = np.asarray(state.lengths)
        versions = np.full(state.tokens.shape, version, np.int32)
        aborted = False
        while True:
            key, chunk_key = jax.random.split(key)
            state = _first_call_alone(
                ("decode", self.config, state.tokens.shape, sampling, self.stop_ids),
                lambda: decode(self._extend, params, state, chunk_key, chunk, self._stop_array(), sampling))
            if not checking or bool(np.all(state.done)):
                break
            latest, latest_params = refresh()
            if latest == version:
                continue
            if on_sync == "abort":
                aborted = True
                break
            # Tokens from here on belong to the new version; earlier ones keep theirs.
            later = np.arange(versions.shape[1]) >= np.asarray(state.lengths)[:, None]
            versions[later] = latest
            version, params = latest, jax.device_put(latest_params)
            state = self._prefill(params, state)
        return self._result(state, start, len(contexts), versions, aborted, version, params)

    def _initial_state(self, contexts: list[list[int]], max_new_tokens: int) -> DecodeState:
        lengths = np.array([len(c) for c in contexts], np.int32)
        if not contexts or lengths.min() < 1 or lengths.max() >= self.max_len:
            raise ValueError(f"context lengths {lengths.tolist()} leave no room in a window of {self.max_len}")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        batch = _bucket(len(contexts), 1)  # padding rows: one pad token, already done
        tokens = np.zeros((batch, self.max_len), np.int32)
        for r, context in enumerate(contexts):
            tokens[r, : len(context)] = context
        lengths = np.pad(lengths, (0, batch - len(contexts)), constant_values=1)
        stop_at = np.minimum(lengths + max_new_tokens, self.max_len)
        stop_at[len(contexts):] = 1
        return DecodeState(
            tokens=jnp.asarray(tokens), logprobs=jnp.zeros(tokens.shape, jnp.float32),
            lengths=jnp.asarray(lengths), stop_at=jnp.asarray(stop_at), done=jnp.asarray(lengths >= stop_at),
            next_logits=jnp.zeros((batch, self.config.vocab_size), jnp.float32),
            cache=init_cache(self.config, batch, self.max_len))

    def _prefill(self, params: Params, state: DecodeState) -> DecodeState:
        length = min(_bucket(int(np.max(state.lengths)), _MIN_PREFILL), self.max_len)
        return _first_call_alone(("prefill", self.config, state.tokens.shape, length),
                                 lambda: prefill(self._extend, params, state, length))

    def _stop_array(self) -> jax.Array:
        return jnp.asarray(self.stop_ids, jnp.int32)

    @staticmethod
    def _result(state: DecodeState, start: np.ndarray, rows: int, versions: np.ndarray, aborted: bool,
                version: int, params: Params) -> Generation:
        tokens, logprobs, end = jax.device_get((state.tokens, state.logprobs, state.lengths))
        spans = [slice(start[r], end[r]) for r in range(rows)]
        return Generation(tokens=tuple(tokens[r, s] for r, s in enumerate(spans)),
                          logprobs=tuple(logprobs[r, s] for r, s in enumerate(spans)),
                          versions=tuple(versions[r, s] for r, s in enumerate(spans)),
                          aborted=aborted, version=version, params=params)


def _bucket(n: int, smallest: int) -> int:
    """The smallest power of two >= max(n, smallest): shapes from a bounded set."""
    return max(smallest, 1 << (n - 1).bit_length())
