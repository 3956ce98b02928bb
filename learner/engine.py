"""Continuous batching: every in-flight request of a process decodes in one batch.

`Engine` holds `slots` rows, each with a KV-cache row of `max_len` positions.
`Engine.step` prefills queued requests into free slots, decodes a chunk for all
active slots in one jitted `lax.while_loop` and returns the finished requests.
Shapes are bounded: the cache is always [slots, max_len]; a prefill runs on K
rows and P positions, both powers of two (K <= slots, 16 <= P <= max_len); decode
masks the rows it decodes and traces its chunk length. So at most
(floor(log2 slots) + 1) * (floor(log2(max_len / 16)) + 1) prefill shapes, one decode.
Token i of a request is drawn with `fold_in(request.key, i)`: the same tokens in
any slot, beside any other requests. Versions follow `actors.on_sync` (README) per
request: a follower switches to newer weights at a check boundary ("retract"), a
pinned request keeps its own ("finish"); each token records its version.
One thread drives an engine at a time (the caller serialises): it takes no locks.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np

from learner.config import ModelConfig
from learner.model import Extend, KVCache, LayerCache, Params, extend_fn, init_cache
from learner.sampling import SamplingParams, sampling_logprobs

_MIN_PREFILL = 16  # shortest prefill bucket: shorter prompts cost the same anyway


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


@functools.partial(jax.jit, static_argnames=("extend", "prefill_len"), donate_argnames=("state",))
def admit(extend: Extend, params: Params, state: Slots, slots_k: jax.Array, new: Rows, prefill_len: int) -> Slots:
    """Writes `new` into slots `slots_k` and prefills their cache over the first `prefill_len` positions.

    Serves a new request and a retract alike. The prefill runs on a compact [K, P]
    cache, then lands in the slots' rows; positions past a row's length are
    padding, overwritten before they are ever read. Slot indices >= B (padding
    rows) are dropped.
    """
    k = slots_k.shape[0]
    positions_kp = jnp.broadcast_to(jnp.arange(prefill_len, dtype=jnp.int32), (k, prefill_len))
    compact = tuple(LayerCache(*(jnp.zeros((k, prefill_len, *x.shape[2:]), x.dtype) for x in layer))
                    for layer in state.cache)
    logits_kv, compact = extend(params, new.tokens[:, :prefill_len], positions_kp, compact, new.lengths - 1)
    cache = tuple(LayerCache(*(x.at[slots_k, :prefill_len].set(y, mode="drop") for x, y in zip(big, small)))
                  for big, small in zip(state.cache, compact))
    return Slots(rows=jax.tree.map(lambda x, y: x.at[slots_k].set(y, mode="drop"), state.rows, new),
                 logprobs_bs=state.logprobs_bs, done_b=state.done_b.at[slots_k].set(False, mode="drop"),
                 next_logits_bv=state.next_logits_bv.at[slots_k].set(logits_kv, mode="drop"), cache=cache)


@functools.partial(jax.jit, static_argnames=("extend", "sampling"), donate_argnames=("state",))
def decode(extend: Extend, params: Params, state: Slots, rows_b: jax.Array, steps: jax.Array,
           stops_v: jax.Array, sampling: SamplingParams) -> tuple[Slots, jax.Array]:
    """Samples up to `steps` tokens for the rows in `rows_b`, returning once one of them finishes.

    A step samples from the current next-token logits and runs the model over one
    cached position only while some row continues: a one-token request costs its
    prefill and no decode pass. Rows outside `rows_b`, and done rows, are untouched.

    Args:
      extend: `extend_fn(config)`; params: the weights of the rows in `rows_b`.
      rows_b: bool [B] the rows to decode (those of one weights version).
      steps: int32 scalar, traced, so every chunk length shares one compile.
      stops_v: bool [V] the tokens that end a row (kept, like eos); sampling: how to draw.

    Returns:
      (the state after the last step, the number of steps taken).
    """
    def step(carry):
        i, s, live_b, _ = carry
        token_b, logp_b = _sample(s, sampling)
        s, finished_b = _append(s, token_b, logp_b, live_b, stops_v)
        live_b = live_b & ~finished_b
        s = jax.lax.cond(jnp.any(live_b), lambda: _extend(extend, params, s, token_b, live_b), lambda: s)
        return i + 1, s, live_b, jnp.any(finished_b)

    def more(carry):
        i, _, live_b, finished = carry
        return (i < steps) & jnp.any(live_b) & ~finished

    i, state, _, _ = jax.lax.while_loop(more, step, (jnp.int32(0), state, rows_b & ~state.done_b, False))
    return state, i


def _sample(state: Slots, sampling: SamplingParams) -> tuple[jax.Array, jax.Array]:
    """Each row's next token, drawn with fold_in(its key, its index), and that token's log-prob."""
    logp_bv = sampling_logprobs(state.next_logits_bv, sampling)
    index_b = state.rows.lengths - state.rows.first
    keys_b = jax.vmap(jax.random.fold_in)(jax.random.wrap_key_data(state.rows.keys), index_b)
    token_b = jax.vmap(jax.random.categorical)(keys_b, logp_bv).astype(jnp.int32)
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


@dataclasses.dataclass(frozen=True)
class Request:
    """A context to continue, and the weights to continue it with."""

    tokens: np.ndarray  # int32 [n] the context so far, 1 <= n < max_len
    max_new_tokens: int  # >= 1
    # A PRNG key (`jax.random.key`, threefry) or its uint32 [2] data, cheaper to pass:
    # token i is drawn with fold_in(key, i).
    key: np.ndarray | jax.Array
    # None follows the latest loaded weights (on_sync "retract"); a version pins the
    # weights `params` (NumPy or JAX) for every token (on_sync "finish").
    version: int | None = None
    params: Params | None = dataclasses.field(default=None, repr=False)


@dataclasses.dataclass(frozen=True)
class Completion:
    """A finished request."""

    id: int  # what `Engine.submit` returned for it
    tokens: np.ndarray  # int32 [k] new tokens (ending with a stop id if it stopped on one)
    logprobs: np.ndarray  # float32 [k] log-prob of each under the distribution it was drawn from
    versions: np.ndarray  # int32 [k] the weights version that generated each token
    # A version newer than its first token's was loaded before it finished (callers
    # with on_sync "abort" discard it).
    newer: bool


class Engine:
    """Decodes every admitted request in one batch of `slots` rows (module docstring)."""

    def __init__(self, config: ModelConfig, *, slots: int, sampling: SamplingParams,
                 stop_ids: tuple[int, ...], check_every: int = 16):
        """Args: config: the policy's model; slots: rows decoded together; sampling: how
        tokens are drawn; stop_ids: tokens that end a request (kept); check_every:
        decode steps between the points where followers switch to newer weights."""
        if slots < 1 or check_every < 1:
            raise ValueError(f"slots ({slots}) and check_every ({check_every}) must be >= 1")
        if not all(0 <= t < config.vocab_size for t in stop_ids):
            raise ValueError(f"stop ids {stop_ids} must be in [0, {config.vocab_size})")
        self.max_len, self.sampling, self.check_every = config.max_len, sampling, check_every
        self._extend = extend_fn(config)
        self._stops_v = jnp.asarray(np.isin(np.arange(config.vocab_size), stop_ids))
        self._state = _empty_slots(config, slots)
        self._rows: list[tuple[int, Request, np.ndarray] | None] = [None] * slots  # (id, request, key data)
        self._version_b = np.full(slots, -1)  # weights version of each slot's row; -1: free
        self._versions_bs = np.zeros((slots, config.max_len), np.int32)  # the version of each token
        self._queue: collections.deque[tuple[int, Request, np.ndarray]] = collections.deque()
        self._params: dict[int, Params] = {}  # on the device: the latest, and those rows use
        self._latest: int | None = None
        self._clock = 0  # decode steps so far: followers switch when it is a multiple of check_every
        self._ids = itertools.count()
        self._prefill_shapes: set[tuple[int, int]] = set()
        self._decoded = False

    @property
    def pending(self) -> int:
        """Requests waiting for a slot."""
        return len(self._queue)

    @property
    def active(self) -> int:
        """Requests in a slot."""
        return int(np.sum(self._version_b >= 0))

    @property
    def idle(self) -> bool:
        """True when no request is pending or active."""
        return not self._queue and not self.active

    @property
    def compiles(self) -> dict[str, int]:
        """Distinct shapes this engine has run (each compiled once per process), by function."""
        return {"prefill": len(self._prefill_shapes), "decode": int(self._decoded)}

    def load(self, version: int, params: Params) -> None:
        """Makes `params` (NumPy or JAX) the latest weights, as `version`; followers switch to them.

        Loading the latest version again does nothing; an older one raises `ValueError`.
        """
        if self._latest is not None and version <= self._latest:
            if version < self._latest:
                raise ValueError(f"version {version} is older than the loaded {self._latest}")
            return
        self._params[version] = jax.device_put(params)  # once per version, not per step
        self._latest = version

    def submit(self, request: Request) -> int:
        """Queues `request` until a slot is free; returns its id (that of its `Completion`)."""
        if not 1 <= len(request.tokens) < self.max_len:
            raise ValueError(f"a context of {len(request.tokens)} tokens leaves no room in a window of {self.max_len}")
        if request.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {request.max_new_tokens}")
        if (request.version is None) != (request.params is None):
            raise ValueError("a pinned request gives both its version and its params; a follower neither")
        key_2 = _key_data(request.key)
        if key_2.shape != (2,):
            raise ValueError(f"key must be a threefry key or its uint32 [2] data, got shape {key_2.shape}")
        self._queue.append((next(self._ids), request, key_2))
        return self._queue[-1][0]

    def step(self) -> list[Completion]:
        """Admits queued requests into free slots, decodes a chunk for every active slot and
        returns the requests that finished, in no particular order.

        At a check boundary (every `check_every` decode steps) followers of older weights
        first switch to the latest: their cache is recomputed with it. A chunk ends at the
        next boundary or at the first decode step in which a request finishes, which returns
        it and frees its slot at once. Against running each chunk to its boundary (demo
        model, one core; as many episodes as slots, each taking 5-20 ms environment steps
        between 6 actions of 1-8 tokens), that served as many actions per second at 64 slots
        and 1.08-1.35x as many at 256, at 0.6-0.95x the latency; with every request queued
        at once it served ~20% fewer (more, smaller prefills).
        """
        if self._clock % self.check_every == 0:
            self._retract()
        self._admit()
        if self.active:
            self._decode()
        return self._collect()

    def _admit(self) -> None:
        """Moves queued requests into free slots: one prefill per weights version among them."""
        if self._latest is None and any(request.version is None for _, request, _ in self._queue):
            raise RuntimeError("a request follows the latest weights, but none were loaded (Engine.load)")
        by_version = collections.defaultdict(list)
        for b in np.flatnonzero(self._version_b < 0)[: len(self._queue)]:
            self._rows[b] = self._queue.popleft()
            by_version[self._weights(self._rows[b][1])].append(b)
        for version, slots in by_version.items():
            contexts = [self._rows[b][1].tokens for b in slots]
            tokens_ns = np.zeros((len(slots), self.max_len), np.int32)
            for tokens_s, context in zip(tokens_ns, contexts):
                tokens_s[: len(context)] = context
            self._write(version, slots, tokens_ns, np.array([len(c) for c in contexts], np.int32))

    def _weights(self, request: Request) -> int:
        """The version a request starts with; a pinned one's weights go to the device once."""
        if request.version is None:
            return self._latest
        if request.version not in self._params:
            self._params[request.version] = jax.device_put(request.params)
        return request.version

    def _retract(self) -> None:
        """Switches followers of older weights to the latest: their cache is recomputed with it."""
        stale = [b for b, row in enumerate(self._rows)
                 if row is not None and row[1].version is None and self._version_b[b] != self._latest]
        if stale:
            tokens_bs, lengths_b = jax.device_get((self._state.rows.tokens, self._state.rows.lengths))
            self._write(self._latest, stale, tokens_bs[stale], lengths_b[stale])

    def _write(self, version: int, slots, tokens_ns: np.ndarray, lengths_n: np.ndarray) -> None:
        """Prefills `slots` with the weights of `version` over their first `lengths_n` tokens;
        the tokens they generate from there on record `version`."""
        requests = [self._rows[b][1] for b in slots]
        first_n = np.array([len(r.tokens) for r in requests], np.int32)
        k = _bucket(len(slots), 1)
        new = Rows(tokens=tokens_ns, lengths=lengths_n, first=first_n,
                   stop_at=np.minimum(first_n + np.array([r.max_new_tokens for r in requests], np.int32), self.max_len),
                   keys=np.stack([self._rows[b][2] for b in slots]))
        new = jax.tree.map(lambda x: _padded(x, k), new)  # padding rows: one token, slot B (dropped)
        prefill_len = min(_bucket(int(lengths_n.max()), _MIN_PREFILL), self.max_len)
        slots_k = np.pad(np.asarray(slots, np.int32), (0, k - len(slots)), constant_values=len(self._rows))
        self._state = admit(self._extend, self._params[version], self._state, slots_k, new, prefill_len)
        self._prefill_shapes.add((k, prefill_len))
        self._version_b[slots] = version
        later_ns = np.arange(self.max_len) >= lengths_n[:, None]
        self._versions_bs[slots] = np.where(later_ns, version, self._versions_bs[slots])

    def _decode(self) -> None:
        """Decodes one chunk: one masked call per weights version among active rows (normally one)."""
        steps, taken = np.int32(self.check_every - self._clock % self.check_every), 0
        for version in np.unique(self._version_b[self._version_b >= 0]):
            self._state, n = decode(self._extend, self._params[version], self._state,
                                    self._version_b == version, steps, self._stops_v, self.sampling)
            taken = max(taken, int(n))
        self._clock += taken  # never past the boundary, where every call stops
        self._decoded = True

    def _collect(self) -> list[Completion]:
        """Frees the slots of finished requests and returns them."""
        done_b, lengths_b = jax.device_get((self._state.done_b, self._state.rows.lengths))
        finished = np.flatnonzero(done_b & (self._version_b >= 0))
        if not finished.size:
            return []
        tokens_bs, logprobs_bs = jax.device_get((self._state.rows.tokens, self._state.logprobs_bs))
        completions = []
        for b in finished:
            request_id, request, _ = self._rows[b]
            span = slice(len(request.tokens), lengths_b[b])
            versions = self._versions_bs[b, span].copy()
            newer = self._latest is not None and self._latest > versions[0]
            completions.append(Completion(request_id, tokens_bs[b, span].copy(), logprobs_bs[b, span].copy(),
                                          versions, newer))
            self._rows[b] = None
        self._version_b[finished] = -1
        self._params = {v: p for v, p in self._params.items() if v == self._latest or v in self._version_b}
        return completions


def _empty_slots(config: ModelConfig, slots: int) -> Slots:
    """Every slot free (done), holding a one-token row over an empty cache."""
    rows = Rows(tokens=jnp.zeros((slots, config.max_len), jnp.int32), lengths=jnp.ones(slots, jnp.int32),
                first=jnp.ones(slots, jnp.int32), stop_at=jnp.ones(slots, jnp.int32),
                keys=jnp.zeros((slots, 2), jnp.uint32))
    return Slots(rows=rows, logprobs_bs=jnp.zeros((slots, config.max_len), jnp.float32),
                 done_b=jnp.ones(slots, bool), next_logits_bv=jnp.zeros((slots, config.vocab_size), jnp.float32),
                 cache=init_cache(config, slots, config.max_len))


def _key_data(key: np.ndarray | jax.Array) -> np.ndarray:
    """The uint32 data of a typed PRNG key; raw key data as it is."""
    if isinstance(key, jax.Array) and jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.key_data(key)
    return np.asarray(key, np.uint32)


def _padded(x: np.ndarray, k: int) -> np.ndarray:
    """`x` with rows of ones appended, up to `k` rows."""
    return np.pad(x, [(0, k - len(x))] + [(0, 0)] * (x.ndim - 1), constant_values=1)


def _bucket(n: int, smallest: int) -> int:
    """The smallest power of two >= max(n, smallest): shapes from a bounded set."""
    return max(smallest, 1 << (n - 1).bit_length())
