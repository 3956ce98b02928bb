"""The device side of `learner.engine`: the slots' state and the pure jitted functions over it.

`admit` writes requests into slots and prefills their cache: the whole context on a
compact [K, P] cache, or only a new suffix on the slots' own cache rows, whose prefix a
finished request of the same episode left there. `decode` samples a chunk of tokens for
the rows of one weights version in one `lax.while_loop`.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from learner.config import ModelConfig
from learner.model import Extend, KVCache, Params, init_cache
from learner.sampling import SamplingParams, sampling_logprobs


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Rows:
    """What each row holds, N rows deep (the B slots, or K rows being admitted); S = max_len."""

    tokens: jax.Array  # int32 [N, S] context and generated tokens, left-aligned
    lengths: jax.Array  # int32 [N] tokens so far; the cache holds positions [0, length)
    first: jax.Array  # int32 [N] context length: token i of the request sits at first + i
    stop_at: jax.Array  # int32 [N] the length at which the row stops
    keys: jax.Array  # uint32 [N, 2] the request's PRNG key data


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Slots:
    """The device state of every slot: B = slots, S = max_len, V = vocabulary."""

    rows: Rows
    logprobs_bs: jax.Array  # float32: log-prob of each generated token
    done_b: jax.Array  # bool: finished, or a free slot
    next_logits_bv: jax.Array  # float32: logits of each row's next token
    cache: KVCache


@functools.partial(jax.jit, static_argnames=("extend", "prefill_len", "suffix"), donate_argnames=("state",))
def admit(extend: Extend, params: Params, state: Slots, slots_k: jax.Array, new: Rows, starts_k: jax.Array,
          prefill_len: int, suffix: bool) -> Slots:
    """Writes `new` into slots `slots_k` and prefills positions [start, start + `prefill_len`) of each.

    Serves a new request and a retract alike. A full prefill (`suffix` False, every
    start 0) runs on a compact [K, P] cache. A suffix prefill runs on the slots' own
    cache rows [K, S], whose positions [0, start) hold the prefix that the same weights
    computed before; starts are traced, so every start shares the compile of its
    (K, P). Positions past a row's length are padding, overwritten before they are ever
    read (positions >= S are dropped). Slot indices >= B (padding rows) are dropped.
    """
    k, window = slots_k.shape[0], state.rows.tokens.shape[1]
    positions_kp = starts_k[:, None] + jnp.arange(prefill_len, dtype=jnp.int32)
    if suffix:
        compact = jax.tree.map(lambda x: x.at[slots_k].get(mode="clip"), state.cache)
    else:
        compact = jax.tree.map(lambda x: jnp.zeros((k, x.shape[1], prefill_len, x.shape[3]), x.dtype), state.cache)
    tokens_kp = jnp.take_along_axis(new.tokens, jnp.minimum(positions_kp, window - 1), axis=1)
    logits_kv, compact = extend(params, tokens_kp, positions_kp, compact, new.lengths - 1 - starts_k)
    cache = jax.tree.map(lambda x, y: x.at[slots_k, :, :y.shape[2]].set(y, mode="drop"), state.cache, compact)
    return Slots(rows=jax.tree.map(lambda x, y: x.at[slots_k].set(y, mode="drop"), state.rows, new),
                 logprobs_bs=state.logprobs_bs, done_b=state.done_b.at[slots_k].set(False, mode="drop"),
                 next_logits_bv=state.next_logits_bv.at[slots_k].set(logits_kv, mode="drop"), cache=cache)


@functools.partial(jax.jit, static_argnames=("extend", "sampling"), donate_argnames=("state",))
def decode(extend: Extend, params: Params, state: Slots, rows_b: jax.Array, steps: jax.Array,
           stops_v: jax.Array, sampling: SamplingParams, greedy: jax.Array) -> tuple[Slots, jax.Array]:
    """Samples up to `steps` tokens for the rows in `rows_b`, returning once one of them finishes.

    A step samples from the current next-token logits and runs the model over one
    cached position only while some row continues: a one-token request costs its
    prefill and no decode pass, and a finished row's last token never reaches its
    cache (which holds positions [0, length - 1)). Rows outside `rows_b`, and done
    rows, are untouched.

    Args:
      extend: `extend_fn(config)`; params: the weights of the rows in `rows_b`.
      rows_b: bool [B] the rows to decode (those of one weights version).
      steps: int32 scalar, traced, so every chunk length shares one compile.
      stops_v: bool [V] the tokens that end a row (kept, like eos); sampling: how to draw.
      greedy: bool scalar, traced: the likeliest token instead of a draw, so that a greedy
        engine shares the compile of one that samples with `sampling`.

    Returns:
      (the state after the last step, the number of steps taken).
    """
    def step(carry):
        i, s, live_b, _ = carry
        token_b, logp_b = _sample(s, sampling, greedy)
        s, finished_b = _append(s, token_b, logp_b, live_b, stops_v)
        live_b = live_b & ~finished_b
        s = jax.lax.cond(jnp.any(live_b), lambda: _extend(extend, params, s, token_b, live_b), lambda: s)
        return i + 1, s, live_b, jnp.any(finished_b)

    def more(carry):
        i, _, live_b, finished = carry
        return (i < steps) & jnp.any(live_b) & ~finished

    i, state, _, _ = jax.lax.while_loop(more, step, (jnp.int32(0), state, rows_b & ~state.done_b, False))
    return state, i


def _sample(state: Slots, sampling: SamplingParams, greedy: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Each row's next token, drawn with fold_in(its key, its index) or the likeliest
    (`greedy`), and that token's log-prob under `sampling`."""
    logp_bv = sampling_logprobs(state.next_logits_bv, sampling)
    index_b = state.rows.lengths - state.rows.first
    keys_b = jax.vmap(jax.random.fold_in)(jax.random.wrap_key_data(state.rows.keys), index_b)
    drawn_b = jax.vmap(jax.random.categorical)(keys_b, logp_bv)
    token_b = jnp.where(greedy, jnp.argmax(logp_bv, axis=-1), drawn_b).astype(jnp.int32)
    return token_b, jnp.take_along_axis(logp_bv, token_b[:, None], axis=1)[:, 0]


def _append(state: Slots, token_b, logp_b, live_b, stops_v) -> tuple[Slots, jax.Array]:
    """Appends each live row's token and log-prob; returns the state and the rows that finished."""
    rows, (b, window) = state.rows, state.rows.tokens.shape
    slot_b = jnp.where(live_b, rows.lengths, window)  # out of range: other rows write nothing
    lengths_b = rows.lengths + live_b
    finished_b = live_b & (stops_v[token_b] | (lengths_b >= rows.stop_at))
    rows = dataclasses.replace(rows, tokens=rows.tokens.at[jnp.arange(b), slot_b].set(token_b, mode="drop"),
                               lengths=lengths_b)
    logprobs_bs = state.logprobs_bs.at[jnp.arange(b), slot_b].set(logp_b, mode="drop")
    return dataclasses.replace(state, rows=rows, logprobs_bs=logprobs_bs, done_b=state.done_b | finished_b), finished_b


def _extend(extend: Extend, params: Params, state: Slots, token_b, live_b) -> Slots:
    """Runs the model over each live row's last token; other rows keep their logits and cache."""
    positions_b = jnp.where(live_b, state.rows.lengths - 1, state.rows.tokens.shape[1])  # out of range: not written
    logits_bv, cache = extend(params, token_b[:, None], positions_b[:, None], state.cache, jnp.zeros_like(token_b))
    next_logits_bv = jnp.where(live_b[:, None], logits_bv, state.next_logits_bv)
    return dataclasses.replace(state, next_logits_bv=next_logits_bv, cache=cache)


def empty_slots(config: ModelConfig, slots: int, cache_dtype: str | None = None) -> Slots:
    """Every slot free (done), holding a one-token row over an empty cache (`init_cache`'s dtype)."""
    rows = Rows(tokens=jnp.zeros((slots, config.max_len), jnp.int32), lengths=jnp.ones(slots, jnp.int32),
                first=jnp.ones(slots, jnp.int32), stop_at=jnp.ones(slots, jnp.int32),
                keys=jnp.zeros((slots, 2), jnp.uint32))
    return Slots(rows=rows, logprobs_bs=jnp.zeros((slots, config.max_len), jnp.float32),
                 done_b=jnp.ones(slots, bool), next_logits_bv=jnp.zeros((slots, config.vocab_size), jnp.float32),
                 cache=init_cache(config, slots, config.max_len, cache_dtype))
