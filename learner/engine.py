"""Continuous batching: every in-flight request of a process decodes in one batch.

`Engine` holds `slots` rows, each with a KV-cache row of `max_len` positions.
`Engine.step` prefills queued requests into free slots, decodes a chunk for all
active slots in one jitted `lax.while_loop` and returns the finished requests
(the jitted functions are in `learner.engine_ops`).

Prefix reuse (vLLM's automatic prefix caching, SGLang's radix cache, in the form a
multi-turn episode needs; bookkeeping in `learner.prefix_cache`): a finished request with
a `prefix_key` leaves its slot free but warm, its cache holding the request's tokens but
the last (never run through the model), computed by one weights version. A later request
with the same key whose tokens extend those, and that starts with that version, is
admitted into that slot and prefills only its new suffix; any other request prefills its
whole context into a cold slot, or else evicts the least recently used warm one
(`Engine.release` turns an ended sequence's slot cold at once). A follower after a newer
version was loaded so recomputes its prefix with the new weights, as a retract would.
Either way a request draws the same tokens (log-probs to float rounding). Admission
stays first come, first served: with more sequences in flight than slots, a turn queued
behind others finds its slot evicted. Demo model, 4-turn episodes of one-token actions
and observations, as many in flight as slots: 1.4-2.0x the episodes per second
(`benchmarks/engine.py --multi-turn`).

Shapes and memory are bounded: the cache is always [slots, max_len]; a prefill runs on K
rows and P positions, both powers of two, P from 16 for a whole context, from 2 for a
suffix (whose per-row start positions are traced), at most min(max_len,
`prefill_tokens`), and K x P <= `prefill_tokens`; decode masks the rows it decodes and
traces its chunk length. A longer context is prefilled in passes of P positions
(chunked prefill, as vLLM and SGLang do), so that neither the compiles nor a prefill's
transient memory (its attention scores, K x P x heads x max_len) grow with the context:
at qwen2-125m, 64 slots x 2,048 positions, one call over every slot's context would
have held 13 GB of scores beside a 3.2 GB cache. With P <= 2**m, at most
(ceil(log2 slots) + 1) * ((m - 3) + m) prefill shapes (the demo's max_len 16: 1
whole-context and 4 suffix lengths per K), one decode.
`Engine.warm_up` compiles them all before the first request, for the K its callers can
reach (at most as many rows as requests in flight at once), so that no request waits on
a compile: an episode's clock (`env.episode_timeout_s`) starts after it.
Token i of a request is drawn with `fold_in(request.key, i)`: the same tokens in
any slot, beside any other requests. Versions follow `actors.on_sync` (README) per
request: a follower switches to newer weights at a check boundary ("retract"), a
pinned request keeps its own ("finish"); each token records its version.
One thread drives an engine at a time (the caller serialises): it takes no locks.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
from collections.abc import Hashable

import jax
import jax.numpy as jnp
import numpy as np

from learner.config import ModelConfig
from learner.engine_ops import Rows, Slots, admit, decode, empty_slots
from learner.model import Params, extend_fn
from learner.prefix_cache import WarmSlots
from learner.sampling import SamplingParams

__all__ = ["Completion", "Engine", "Request", "Rows", "Slots", "admit", "decode"]

_MIN_PREFILL = 16  # shortest prefill bucket: shorter prompts cost the same anyway
_MIN_SUFFIX = 2  # shortest suffix bucket: a turn's last action token and its observation


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
    # Any hashable naming the sequence this request continues (an episode's identity):
    # its slot stays warm when it finishes, and the next request with the same key
    # prefills only what it adds (module docstring). None: no reuse.
    prefix_key: Hashable | None = None


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
                 stop_ids: tuple[int, ...], check_every: int = 16, greedy: bool = False,
                 prefill_tokens: int = 2048, kv_cache_dtype: str | None = None):
        """Args: config: the policy's model; slots: rows decoded together; sampling: how
        tokens are drawn; stop_ids: tokens that end a request (kept); check_every:
        decode steps between the points where followers switch to newer weights; greedy:
        the likeliest token instead of a draw (log-probs still under `sampling`), sharing
        the compiled decode of an engine that samples with `sampling` (an evaluation
        beside the actor in its process compiles nothing new); prefill_tokens: a power of
        two, the most positions one prefill call runs (rows x length; module docstring);
        kv_cache_dtype: the cache's keys and values, "float32" or "bfloat16" (None: the
        model's compute dtype). A bfloat16 cache under float32 weights halves the bytes a
        decode step's attention reads, for keys and values rounded to 8 bits of mantissa."""
        if slots < 1 or check_every < 1:
            raise ValueError(f"slots ({slots}) and check_every ({check_every}) must be >= 1")
        if prefill_tokens < _MIN_PREFILL or prefill_tokens & (prefill_tokens - 1):
            raise ValueError(f"prefill_tokens must be a power of two >= {_MIN_PREFILL}, got {prefill_tokens}")
        self.prefill_tokens = prefill_tokens
        if not all(0 <= t < config.vocab_size for t in stop_ids):
            raise ValueError(f"stop ids {stop_ids} must be in [0, {config.vocab_size})")
        self.max_len, self.sampling, self.check_every = config.max_len, sampling, check_every
        self._greedy = jnp.asarray(greedy)
        self._extend = extend_fn(config)
        self._stops_v = jnp.asarray(np.isin(np.arange(config.vocab_size), stop_ids))
        if kv_cache_dtype not in (None, "float32", "bfloat16"):
            raise ValueError(f'kv_cache_dtype must be "float32", "bfloat16" or None, not {kv_cache_dtype!r}')
        self._state = empty_slots(config, slots, kv_cache_dtype)
        self._rows: list[tuple[int, Request, np.ndarray] | None] = [None] * slots  # (id, request, key data)
        self._version_b = np.full(slots, -1)  # weights version of each slot's row; -1: free
        self._versions_bs = np.zeros((slots, config.max_len), np.int32)  # the version of each token
        self._warm = WarmSlots(slots)
        self._queue: collections.deque[tuple[int, Request, np.ndarray]] = collections.deque()
        self._params: dict[int, Params] = {}  # on the device: the latest, and those rows use
        self._latest: int | None = None
        self._clock = 0  # decode steps so far: followers switch when it is a multiple of check_every
        self._ids = itertools.count()
        self._prefill_shapes: set[tuple[int, int, bool]] = set()  # (K, P, suffix)
        self._admitted = {"full": 0, "suffix": 0}
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
    def warm(self) -> int:
        """Free slots holding a finished request's prefix for its next turn."""
        return len(self._warm)

    @property
    def idle(self) -> bool:
        """True when no request is pending or active."""
        return not self._queue and not self.active

    @property
    def compiles(self) -> dict[str, int]:
        """Distinct shapes this engine has run (each compiled once per process), by function:
        whole-context prefills, suffix prefills, decode."""
        suffixes = sum(suffix for _, _, suffix in self._prefill_shapes)
        return {"prefill": len(self._prefill_shapes) - suffixes, "suffix": suffixes, "decode": int(self._decoded)}

    @property
    def device_bytes(self) -> dict[str, int]:
        """Bytes the engine holds on its device: "kv_cache" (slots x max_len positions, as its
        shape says), "slots" (the whole slot state: the cache, each row's tokens, log-probs
        and next-token logits) and "weights" (every version in use)."""
        size = lambda tree: sum(x.nbytes for x in jax.tree.leaves(tree))  # noqa: E731
        return {"kv_cache": size(self._state.cache), "slots": size(self._state), "weights": size(self._params)}

    @property
    def admitted(self) -> dict[str, int]:
        """Requests admitted so far: "full" prefilled their whole context, "suffix" only
        what they add to a warm prefix (retracts not counted)."""
        return dict(self._admitted)

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

    def release(self, prefix_key: Hashable) -> None:
        """Forgets what the slot of `prefix_key` holds, if it is warm (its sequence has ended):
        the slot turns cold, so it is taken before any warm one. Unknown keys are ignored."""
        self._warm.drop(prefix_key)

    def submit(self, request: Request) -> int:
        """Queues `request` until a slot is free; returns its id (that of its `Completion`)."""
        if not 1 <= len(request.tokens) < self.max_len:
            raise ValueError(f"a context of {len(request.tokens)} tokens leaves no room in a window of {self.max_len}")
        if request.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {request.max_new_tokens}")
        if (request.version is None) != (request.params is None):
            raise ValueError("a pinned request gives both its version and its params; a follower neither")
        if not isinstance(request.prefix_key, Hashable):
            raise TypeError(f"prefix_key must be hashable, got {type(request.prefix_key).__name__}")
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
        """Moves queued requests (first come, first served) into free slots: each onto its
        own warm prefix where `WarmSlots.claim` allows, the others into spare slots; one
        prefill per weights version and kind (whole context, suffix) among them."""
        if self._latest is None and any(request.version is None for _, request, _ in self._queue):
            raise RuntimeError("a request follows the latest weights, but none were loaded (Engine.load)")
        free = np.flatnonzero(self._version_b < 0)
        batch = [self._queue.popleft() for _ in range(min(len(free), len(self._queue)))]
        versions = [self._weights(request) for _, request, _ in batch]
        claims = [self._warm.claim(request.prefix_key, request.tokens, version)
                  for (_, request, _), version in zip(batch, versions)]
        spare = self._warm.spare(free, {claim[0] for claim in claims if claim is not None})
        groups = collections.defaultdict(list)
        for entry, version, claim in zip(batch, versions, claims):
            slot, start = claim or (next(spare), 0)
            self._rows[slot] = entry
            groups[version, start > 0].append((slot, start))
        for (version, suffix), placed in groups.items():
            slots, starts = (np.array(x) for x in zip(*placed))
            contexts = [self._rows[b][1].tokens for b in slots]
            tokens_ns = np.zeros((len(slots), self.max_len), np.int32)
            for tokens_s, context in zip(tokens_ns, contexts):
                tokens_s[: len(context)] = context
            lengths_n = np.array([len(c) for c in contexts], np.int32)
            self._write(version, slots, tokens_ns, lengths_n, starts.astype(np.int32) if suffix else None)
            self._admitted["suffix" if suffix else "full"] += len(slots)

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

    def _write(self, version: int, slots, tokens_ns: np.ndarray, lengths_n: np.ndarray,
               starts_n: np.ndarray | None = None) -> None:
        """Prefills `slots` with the weights of `version` over their first `lengths_n` tokens,
        from `starts_n` on (their cache holds the rest), or from 0 if None; the tokens they
        generate from there on record `version`.

        In chunks (module docstring): each pass runs at most `prefill_tokens` positions of
        the rows with tokens left, in calls of at most `_rows_per_call` rows; a row's
        next-token logits are those of the pass that reaches its last token (an earlier
        pass's are overwritten), and every pass after a whole-context first one continues
        on the rows' own cache, as a suffix does."""
        slots = np.asarray(slots, np.int32)
        requests = [self._rows[b][1] for b in slots]
        first_n = np.array([len(r.tokens) for r in requests], np.int32)
        new = Rows(tokens=tokens_ns, lengths=lengths_n, first=first_n,
                   stop_at=np.minimum(first_n + np.array([r.max_new_tokens for r in requests], np.int32), self.max_len),
                   keys=np.stack([self._rows[b][2] for b in slots]))
        suffix = starts_n is not None
        done_n = starts_n.astype(np.int32) if suffix else np.zeros(len(slots), np.int32)
        while (left_n := lengths_n - done_n).max() > 0:
            rows = np.flatnonzero(left_n > 0)
            prefill_len = self._prefill_len(int(left_n[rows].max()), suffix)
            per_call = self._rows_per_call(prefill_len, suffix)
            for part in (rows[i:i + per_call] for i in range(0, len(rows), per_call)):
                self._prefill(version, slots[part], jax.tree.map(lambda x: x[part], new), done_n[part],
                              _bucket(len(part), 1), prefill_len, suffix)
            done_n[rows] += prefill_len
            suffix = True
        self._version_b[slots] = version
        later_ns = np.arange(self.max_len) >= lengths_n[:, None]
        self._versions_bs[slots] = np.where(later_ns, version, self._versions_bs[slots])

    def _prefill_len(self, tokens: int, suffix: bool) -> int:
        """P, the positions a prefill pass of `tokens` new tokens runs on: its power-of-two
        bucket, at most `prefill_tokens` (a longer context takes several passes)."""
        return min(_bucket(tokens, _MIN_SUFFIX if suffix else _MIN_PREFILL), self.max_len, self.prefill_tokens)

    def _rows_per_call(self, prefill_len: int, suffix: bool) -> int:
        """K, the most rows of one prefill call of P = `prefill_len` positions: K x P <=
        `prefill_tokens`, and a suffix call, which copies its rows' whole cache rows
        (`engine_ops.admit`), copies at most 8 x `prefill_tokens` positions; a power of two."""
        rows = self.prefill_tokens // prefill_len
        if suffix:
            rows = min(rows, 8 * self.prefill_tokens // self.max_len)
        rows = min(max(rows, 1), len(self._rows))
        return 1 << (rows.bit_length() - 1)

    def _prefill(self, version: int, slots_n: np.ndarray, new: Rows, starts_n: np.ndarray, k: int,
                 prefill_len: int, suffix: bool) -> None:
        """`admit` of the N rows `new` into `slots_n`, padded to `k` rows: padding rows hold
        one token and slot B, so they write nothing (`admit` drops them)."""
        pad = k - len(slots_n)
        self._state = admit(self._extend, self._params[version], self._state,
                            np.pad(slots_n, (0, pad), constant_values=len(self._rows)),
                            jax.tree.map(lambda x: _padded(x, k), new), np.pad(starts_n, (0, pad)),
                            prefill_len, suffix)
        self._prefill_shapes.add((k, prefill_len, suffix))

    def _decode(self) -> None:
        """Decodes one chunk: one masked call per weights version among active rows (normally one)."""
        steps, taken = np.int32(self.check_every - self._clock % self.check_every), 0
        for version in np.unique(self._version_b[self._version_b >= 0]):
            taken = max(taken, self._decode_rows(version, self._version_b == version, steps))
        self._clock += taken  # never past the boundary, where every call stops

    def _decode_rows(self, version: int, rows_b: np.ndarray, steps: np.int32) -> int:
        """`decode` of the rows `rows_b` with the weights of `version`; the steps it took."""
        self._state, n = decode(self._extend, self._params[version], self._state, rows_b, steps, self._stops_v,
                                self.sampling, self._greedy)
        self._decoded = True
        return int(n)

    def prefill_shapes(self, in_flight: int | None = None) -> list[tuple[int, int, bool]]:
        """Every prefill shape (K, P, suffix) this engine can run while at most `in_flight`
        requests (default: `slots`) are in it at once: a prefill admits or retracts no more
        rows than that, K its power-of-two bucket; P any bucket of a context (whole) or of
        what a turn adds (suffix), at most `prefill_tokens` (module docstring)."""
        rows = _bucket(min(in_flight or len(self._rows), len(self._rows)), 1)
        lengths = {suffix: sorted({self._prefill_len(n, suffix) for n in range(1, self.max_len + 1)})
                   for suffix in (False, True)}
        return [(1 << i, p, suffix) for suffix, ps in lengths.items() for p in ps
                for i in range(min(rows, self._rows_per_call(p, suffix)).bit_length())]

    def warm_up(self, in_flight: int | None = None) -> int:
        """Compiles the decode and every prefill shape of `prefill_shapes(in_flight)` now, so
        that none is compiled under a request: a compile takes ~0.5-5 s on a CPU, and the
        first turns of the first episodes met a new shape each, their clock running
        (`env.episode_timeout_s`). Runs padding rows only, with the latest weights (`load`
        them first): no slot changes; `compiles` counts these shapes. Returns how many
        shapes it ran (each compiled at most once per process: a second engine of the same
        config and slots in the process runs them from JAX's cache)."""
        if self._latest is None:
            raise RuntimeError("warm_up runs the latest weights, but none were loaded (Engine.load)")
        shapes = self.prefill_shapes(in_flight)
        empty = Rows(tokens=np.zeros((0, self.max_len), np.int32), lengths=np.zeros(0, np.int32),
                     first=np.zeros(0, np.int32), stop_at=np.zeros(0, np.int32), keys=np.zeros((0, 2), np.uint32))
        for k, prefill_len, suffix in shapes:
            self._prefill(self._latest, np.zeros(0, np.int32), empty, np.zeros(0, np.int32), k, prefill_len, suffix)
        self._decode_rows(self._latest, np.zeros(len(self._rows), bool), np.int32(self.check_every))
        jax.block_until_ready(self._state)
        return len(shapes) + 1

    def _collect(self) -> list[Completion]:
        """Frees the slots of finished requests (warm, for those with a prefix key) and returns them."""
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
            if request.prefix_key is not None:  # the cache holds all but the last token (`decode`)
                self._warm.keep(b, request.prefix_key, tokens_bs[b, : lengths_b[b] - 1].copy(),
                                int(self._version_b[b]))
            self._rows[b] = None
        self._version_b[finished] = -1
        self._params = {v: p for v, p in self._params.items() if v == self._latest or v in self._version_b}
        return completions


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
