"""The policy: a decoder-only transformer of the Llama/Qwen2 family in Flax NNX.

Pre-norm RMSNorm, rotary position embeddings, grouped-query attention and a SwiGLU
MLP. Sequences may be packed several to a row: `segment_ids` keeps them from
attending to each other and `positions` restart at 0 in each, so a packed sequence
sees exactly what it would see alone in a row.

Outside this module the parameters are a pure nested dict (`init_params`) and the
model is the pure function `forward_fn(config)`, which jits, differentiates and
shards like any JAX function. Generation uses `extend_fn(config)`, the same model
over a fixed-size key/value cache (`init_cache`): a prompt is prefilled in one call
and each further token costs one position, not the whole window.

`forward_fn(config, remat="block")` rematerialises each block: the backward pass
recomputes a block's activations from its input instead of keeping them from the
forward pass. Values are unchanged; the learner picks it (`LearnerConfig.remat`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Literal, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from learner.config import ModelConfig

Params = dict[str, Any]
Remat = Literal["none", "block"]  # the values of `LearnerConfig.remat`
Forward = Callable[..., jax.Array]  # (params, tokens, positions, segment_ids, select=None) -> logits


class LayerCache(NamedTuple):
    """One layer's keys and values, [B, n_kv_heads, S, head_dim]; slot s holds position s.

    Heads before positions, so that attention reads each head's keys as one contiguous
    [S, head_dim] matrix: with positions first, XLA:CPU transposed the whole cache on every
    decode step, and attention over a 1,024-token cache took 6x as long
    (`benchmarks/llm_shapes.py`).
    """

    k: jax.Array
    v: jax.Array

    @property
    def length(self) -> int:
        """S, the positions each row holds."""
        return self.k.shape[2]


KVCache = tuple[LayerCache, ...]
Extend = Callable[[Params, jax.Array, jax.Array, KVCache, jax.Array], tuple[jax.Array, KVCache]]

# Llama's initialiser: small embeddings make a freshly initialised policy nearly
# uniform over the vocabulary, which RL from scratch needs to explore.
_EMBED_INIT = nnx.initializers.normal(stddev=0.02)


class RMSNorm(nnx.Module):
    """Root-mean-square normalisation with a learned scale, computed in float32."""

    def __init__(self, dim: int, *, eps: float):
        self.scale = nnx.Param(jnp.ones((dim,), jnp.float32))
        self.eps = eps

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return (x32 * self.scale[...]).astype(x.dtype)


def apply_rope(x_blhd: jax.Array, positions_bl: jax.Array, theta: float) -> jax.Array:
    """Rotates query or key features by their positions (Llama's half-split layout).

    Args:
      x_blhd: [B, L, heads, head_dim] queries or keys.
      positions_bl: int [B, L] position of each token within its own sequence.
      theta: RoPE base frequency.

    Returns:
      The rotated features, [B, L, heads, head_dim], in the dtype of `x_blhd`.
    """
    half = x_blhd.shape[-1] // 2
    inv_freq = theta ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angles = positions_bl.astype(jnp.float32)[..., None] * inv_freq  # [B, L, half]
    sin, cos = jnp.sin(angles)[:, :, None, :], jnp.cos(angles)[:, :, None, :]
    x1, x2 = jnp.split(x_blhd.astype(jnp.float32), 2, axis=-1)
    rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return rotated.astype(x_blhd.dtype)


def attention_mask(segment_ids_bl: jax.Array) -> jax.Array:
    """bool [B, 1, L, L]: query t sees key s iff s <= t, same segment, not padding."""
    length = segment_ids_bl.shape[1]
    causal = jnp.tril(jnp.ones((length, length), bool))
    same_segment = segment_ids_bl[:, :, None] == segment_ids_bl[:, None, :]
    not_padding = (segment_ids_bl != 0)[:, :, None]
    return (causal & same_segment & not_padding)[:, None]


def cache_mask(positions_bt: jax.Array, cache_len: int) -> jax.Array:
    """bool [B, 1, T, S]: the query at position p sees cache slots 0..p."""
    return (jnp.arange(cache_len)[None, None, :] <= positions_bt[:, :, None])[:, None]


def _dense(in_features: int, out_features: int, config: ModelConfig, rngs: nnx.Rngs,
           *, use_bias: bool = False) -> nnx.Linear:
    return nnx.Linear(
        in_features, out_features, use_bias=use_bias, dtype=config.dtype, param_dtype=jnp.float32, rngs=rngs
    )


class Attention(nnx.Module):
    """Grouped-query self-attention: n_heads queries share n_kv_heads keys and values."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        d, hd = config.d_model, config.head_dim
        # Qwen2 has biases on the query, key and value projections; Llama has none.
        self.q = _dense(d, config.n_heads * hd, config, rngs, use_bias=config.qkv_bias)
        self.k = _dense(d, config.n_kv_heads * hd, config, rngs, use_bias=config.qkv_bias)
        self.v = _dense(d, config.n_kv_heads * hd, config, rngs, use_bias=config.qkv_bias)
        self.o = _dense(config.n_heads * hd, d, config, rngs)
        self.n_heads, self.n_kv_heads, self.head_dim = config.n_heads, config.n_kv_heads, hd
        self.rope_theta = config.rope_theta

    def _qkv(self, x_bld: jax.Array, positions_bl: jax.Array):
        b, l, _ = x_bld.shape
        q = self.q(x_bld).reshape(b, l, self.n_heads, self.head_dim)
        k = self.k(x_bld).reshape(b, l, self.n_kv_heads, self.head_dim)
        v = self.v(x_bld).reshape(b, l, self.n_kv_heads, self.head_dim)
        return apply_rope(q, positions_bl, self.rope_theta), apply_rope(k, positions_bl, self.rope_theta), v

    def __call__(self, x_bld: jax.Array, positions_bl: jax.Array, mask_b1ll: jax.Array) -> jax.Array:
        out = causal_attention(*self._qkv(x_bld, positions_bl), mask_b1ll)  # [B, L, H, D]
        return self.o(out.reshape(*x_bld.shape[:2], self.n_heads * self.head_dim))

    def extend(self, x_btd: jax.Array, positions_bt: jax.Array, cache: LayerCache) -> tuple[jax.Array, LayerCache]:
        """Attends new tokens to the cache after writing their keys and values at their positions.

        Slots past a row's last real token may hold stale or padding entries: they are
        never read, since a query only sees slots up to its own position, and a later
        token overwrites its slot before reading it. Positions >= S are dropped.
        """
        q, k, v = self._qkv(x_btd, positions_bt)
        rows = jnp.arange(x_btd.shape[0])[:, None]
        # Indices split by a slice put their dims first: the update is [B, T, heads, head_dim].
        cache = LayerCache(cache.k.at[rows, :, positions_bt].set(k.astype(cache.k.dtype), mode="drop"),
                           cache.v.at[rows, :, positions_bt].set(v.astype(cache.v.dtype), mode="drop"))
        mask_b1ts = cache_mask(positions_bt, cache.length)
        # The queries meet the cache in its dtype: upcasting a narrower cache would copy all
        # of it every step, and reading it is what a decode step's attention costs.
        out = cached_attention(q.astype(cache.k.dtype), cache.k, cache.v, mask_b1ts).astype(q.dtype)
        return self.o(out.reshape(*q.shape[:2], self.n_heads * self.head_dim)), cache


_QUERY_CHUNK = 128  # queries per attention product over a whole row


def causal_attention(q_blhd: jax.Array, k_blkd: jax.Array, v_blkd: jax.Array, mask_b1ll: jax.Array) -> jax.Array:
    """Grouped-query self-attention over whole rows whose mask is causal, in chunks of queries.

    A chunk of queries ending at position e meets keys 0..e-1 only: every later key is
    masked for all of them, so the products skip the upper triangle (half of a row's
    attention at long lengths) and each chunk's scores stay small. On a 2 x 1,024 row
    batch (12 heads over 4) this was 2.6x faster, forward and backward, than
    `jax.nn.dot_product_attention` over the whole square (171 against 450 ms a layer;
    at 2,048 tokens 665 against 1,586 ms), 128 queries a chunk (64 and 256 were no
    faster; BENCHMARKS.md (t)). The chunks are unrolled: a row of L tokens traces
    L / 128 products a layer, and the step compiles longer (13.6 against 6.7 s there).

    Args:
      q_blhd: [B, L, H, D] queries; H = K x G, query head h reads key head h // G.
      k_blkd, v_blkd: [B, L, K, D] keys and values.
      mask_b1ll: bool [B, 1, L, L], causal (`attention_mask`).

    Returns:
      [B, L, H, D], as `jax.nn.dot_product_attention` gives (rows whose mask is all
      false, padding's, differ: they are read by nothing).
    """
    length = q_blhd.shape[1]
    k_bkld, v_bkld = k_blkd.transpose(0, 2, 1, 3), v_blkd.transpose(0, 2, 1, 3)
    chunks = [
        _attention(q_blhd[:, start:end], k_bkld[:, :, :end], v_bkld[:, :, :end], mask_b1ll[:, :, start:end, :end])
        for start, end in ((s, min(s + _QUERY_CHUNK, length)) for s in range(0, length, _QUERY_CHUNK))
    ]
    return jnp.concatenate(chunks, axis=1)


_ROWS_FROM_BYTES = 4 << 20  # a layer's cached keys, beyond which CPU attention goes row by row


def cached_attention(q_bthd: jax.Array, k_bksd: jax.Array, v_bksd: jax.Array, mask_b1ts: jax.Array) -> jax.Array:
    """Grouped-query attention of T new queries over a cache laid out heads first.

    Each key head's G query heads and T positions form one [G x T, D] matrix, so both
    products are plain batched matmuls over (B, K) with contiguous operands: XLA:CPU ran
    the five-dimensional einsum of `jax.nn.dot_product_attention` 2.6x slower on a decode
    step (`benchmarks/llm_shapes.py`).

    On CPU the rows go one at a time (`lax.map`): XLA:CPU read a cache of many rows at
    4-5 GB/s in one batched product (12 layers' decode attention at 32 rows x 1,088
    positions: 186 ms), one row's keys and values at a time stay in the core's cache
    (74 ms, 11.5 GB/s; at 8 rows 19 ms against 25). A bfloat16 cache, and any other
    backend, takes one batched product: row by row, a bfloat16 cache decoded no faster here
    (105 against 111 tok/s at 32 slots). Only a large cache: a layer's keys under
    `_ROWS_FROM_BYTES` fit the cores' caches whole, and the loop cost 4-6x the batched
    product there (the demo's 128 rows x 16 positions: 1.2 against 0.3 ms).

    Args:
      q_bthd: [B, T, H, D] queries; H = K x G, query head h reads key head h // G.
      k_bksd, v_bksd: [B, K, S, D] the cache's keys and values.
      mask_b1ts: bool [B, 1, T, S] which slots each query sees.

    Returns:
      [B, T, H, D], as `jax.nn.dot_product_attention` over the same keys gives.
    """
    if jax.default_backend() == "cpu" and k_bksd.dtype == jnp.float32 and k_bksd.nbytes > _ROWS_FROM_BYTES:
        return jax.lax.map(lambda row: _attention(*(x[None] for x in row))[0], (q_bthd, k_bksd, v_bksd, mask_b1ts))
    return _attention(q_bthd, k_bksd, v_bksd, mask_b1ts)


def _attention(q_bthd: jax.Array, k_bksd: jax.Array, v_bksd: jax.Array, mask_b1ts: jax.Array) -> jax.Array:
    b, t, h, d = q_bthd.shape
    kv_heads, s = k_bksd.shape[1:3]
    g = h // kv_heads
    q_bkmd = q_bthd.reshape(b, t, kv_heads, g, d).transpose(0, 2, 3, 1, 4).reshape(b, kv_heads, g * t, d)
    scores = jnp.einsum("bkmd,bksd->bkms", q_bkmd, k_bksd, preferred_element_type=jnp.float32) * d ** -0.5
    mask_b1ms = jnp.broadcast_to(mask_b1ts[:, :, None], (b, 1, g, t, s)).reshape(b, 1, g * t, s)
    probs = jax.nn.softmax(jnp.where(mask_b1ms, scores, jnp.finfo(jnp.float32).min), axis=-1)
    out_bkmd = jnp.einsum("bkms,bksd->bkmd", probs.astype(v_bksd.dtype), v_bksd)
    return out_bkmd.reshape(b, kv_heads, g, t, d).transpose(0, 3, 1, 2, 4).reshape(b, t, h, d)


class MLP(nnx.Module):
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        self.gate = _dense(config.d_model, config.d_ff, config, rngs)
        self.up = _dense(config.d_model, config.d_ff, config, rngs)
        self.down = _dense(config.d_ff, config.d_model, config, rngs)

    def __call__(self, x_bld: jax.Array) -> jax.Array:
        return self.down(jax.nn.silu(self.gate(x_bld)) * self.up(x_bld))


class Block(nnx.Module):
    """One pre-norm transformer layer: attention then MLP, each on a residual."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        self.attn_norm = RMSNorm(config.d_model, eps=config.norm_eps)
        self.attn = Attention(config, rngs=rngs)
        self.mlp_norm = RMSNorm(config.d_model, eps=config.norm_eps)
        self.mlp = MLP(config, rngs=rngs)

    def __call__(self, x_bld: jax.Array, positions_bl: jax.Array, mask_b1ll: jax.Array) -> jax.Array:
        x_bld = x_bld + self.attn(self.attn_norm(x_bld), positions_bl, mask_b1ll)
        return x_bld + self.mlp(self.mlp_norm(x_bld))

    def extend(self, x_btd: jax.Array, positions_bt: jax.Array, cache: LayerCache) -> tuple[jax.Array, LayerCache]:
        attended, cache = self.attn.extend(self.attn_norm(x_btd), positions_bt, cache)
        x_btd = x_btd + attended
        return x_btd + self.mlp(self.mlp_norm(x_btd)), cache


def _apply_block(block: Block, x_bld: jax.Array, positions_bl: jax.Array, mask_b1ll: jax.Array) -> jax.Array:
    return block(x_bld, positions_bl, mask_b1ll)


# jax.checkpoint's default policy saves nothing inside the block: only its inputs are
# kept for the backward pass, which reruns the block's forward to differentiate it.
# The stored activations of a layer shrink from its attention probabilities
# ([B, heads, L, L]) and MLP hidden units ([B, L, d_ff], several of each) to the
# residual stream ([B, L, d_model]), for one more forward pass of the blocks.
# Optimisation barriers keep XLA from merging the recomputation back into the forward
# pass. XLA:CPU removes them before its common-subexpression pass, which then merges
# the recomputed matmuls with the forward's (their outputs are kept): on CPU remat
# redoes elementwise work and saves almost no memory (benchmarks/learner_throughput.py).
_remat_block = nnx.remat(_apply_block)


class Transformer(nnx.Module):
    """Decoder-only language model over packed rows of token ids."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        self.embed = nnx.Embed(
            config.vocab_size,
            config.d_model,
            dtype=config.dtype,
            param_dtype=jnp.float32,
            embedding_init=_EMBED_INIT,
            rngs=rngs,
        )
        self.blocks = nnx.List([Block(config, rngs=rngs) for _ in range(config.n_layers)])
        self.final_norm = RMSNorm(config.d_model, eps=config.norm_eps)
        untied = not config.tie_embeddings
        self.lm_head = _dense(config.d_model, config.vocab_size, config, rngs) if untied else None

    def __call__(self, tokens: jax.Array, positions: jax.Array, segment_ids: jax.Array,
                 *, remat: Remat = "none", select: jax.Array | None = None) -> jax.Array:
        """Next-token logits, float32 [B, L, vocab], from int32 [B, L] inputs; with `select`
        (int32 [B, K] indices into L), only at those positions: [B, K, vocab].

        remat "block": each block's activations are recomputed in the backward pass.
        """
        mask = attention_mask(segment_ids)
        x = self.embed(tokens)
        apply_block = _remat_block if remat == "block" else _apply_block
        for block in self.blocks:
            x = apply_block(block, x, positions, mask)
        if select is not None:  # the output head, a vocabulary wide, only where a loss reads it
            x = jnp.take_along_axis(x, select[:, :, None], axis=1)
        return self._logits(x)

    def extend(self, tokens: jax.Array, positions: jax.Array, cache: KVCache,
               last: jax.Array) -> tuple[jax.Array, KVCache]:
        """Next-token logits after `tokens` [B, T] (float32 [B, vocab], read at index `last` [B]).

        Only one position per row reaches the output head, so a long prefill never
        materialises [B, T, vocab] logits.
        """
        x = self.embed(tokens)
        new_cache = []
        for block, layer_cache in zip(self.blocks, cache):
            x, layer_cache = block.extend(x, positions, layer_cache)
            new_cache.append(layer_cache)
        x_last = jnp.take_along_axis(x, last[:, None, None], axis=1)
        return self._logits(x_last)[:, 0], tuple(new_cache)

    def _logits(self, x: jax.Array) -> jax.Array:
        x = self.final_norm(x)
        logits = self.embed.attend(x) if self.lm_head is None else self.lm_head(x)
        return logits.astype(jnp.float32)


def init_params(config: ModelConfig, seed: int | jax.Array) -> Params:
    """Randomly initialised parameters as a pure nested dict of float32 arrays.

    `seed` may be traced, so a sharded state can be initialised inside `jax.jit`.
    """
    model = Transformer(config, rngs=nnx.Rngs(jax.random.key(seed)))
    return nnx.to_pure_dict(nnx.state(model, nnx.Param))


def forward_fn(config: ModelConfig, *, remat: Remat = "none") -> Forward:
    """The model as a pure function `(params, tokens, positions, segment_ids, select=None) -> logits`
    (`select`: the positions whose logits are wanted; all by default).

    The module structure is captured once from an abstract model (no weights are
    allocated); each call rebuilds the module around `params`, which is free under
    `jax.jit` and lets the same function serve the sampler and the train step.
    `remat` ("none" or "block", see `LearnerConfig.remat`) changes only what its
    gradient keeps and recomputes, never the values.
    """
    return _Forward(config, remat)


def extend_fn(config: ModelConfig) -> Extend:
    """The model over a KV cache: `(params, tokens, positions, cache, last) -> (logits, cache)`.

    Args (of the returned function):
      params: as for `forward_fn`.
      tokens: int32 [B, T] new tokens (T = a padded prompt for a prefill, 1 for a decode step).
      positions: int32 [B, T] their positions, which are also their cache slots.
      cache: the `KVCache` holding every earlier position of each row.
      last: int32 [B] index in [0, T) of the token whose next-token logits are returned.

    Returns:
      (float32 [B, vocab] next-token logits, the updated cache).
    """
    return _Extend(config)


# The model functions are jit static arguments: they compare by config, not by identity,
# so that every caller with an equal config (any thread, any unpickled copy) shares the
# compiled code. (Functions cached per config were not enough: actors starting together
# in one process each built their own, and compiled every shape once each.)
@dataclasses.dataclass(frozen=True)
class _Forward:
    config: ModelConfig
    remat: Remat = "none"

    def __call__(self, params: Params, tokens, positions, segment_ids, select=None) -> jax.Array:
        return nnx.merge(_graphdef(self.config), params)(tokens, positions, segment_ids, remat=self.remat,
                                                         select=select)


@dataclasses.dataclass(frozen=True)
class _Extend:
    config: ModelConfig

    def __call__(self, params: Params, tokens, positions, cache, last):
        return nnx.merge(_graphdef(self.config), params).extend(tokens, positions, cache, last)


@functools.cache
def _graphdef(config: ModelConfig) -> nnx.GraphDef:
    return nnx.split(nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0))))[0]


def init_cache(config: ModelConfig, batch: int, length: int, dtype: str | None = None) -> KVCache:
    """An empty cache of `length` slots per row, in `dtype` (None: the model's compute dtype)."""
    shape, dtype = (batch, config.n_kv_heads, length, config.head_dim), dtype or config.dtype
    return tuple(LayerCache(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)) for _ in range(config.n_layers))
