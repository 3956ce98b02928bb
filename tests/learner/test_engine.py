import dataclasses

import jax
import numpy as np
import pytest

from learner.config import ModelConfig, TokenizerConfig
from learner.engine import Completion, Engine, Request, admit, decode
from learner.model import forward_fn, init_params
from learner.sampling import SamplingParams

CONFIG = ModelConfig(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=64, max_len=16,
                     tokenizer=TokenizerConfig(alphabet="abcdef"))
SAMPLING = SamplingParams()  # temperature 1, no filter: log-probs are the model's own
SLOTS = 4  # one slot count for most tests: each count compiles its own shapes
_forward = jax.jit(forward_fn(CONFIG))


@pytest.fixture(scope="module")
def params():
    return init_params(CONFIG, seed=0), init_params(CONFIG, seed=1)


def _engine(params, *, slots, stop_ids=(), check_every=16, config=CONFIG, kv_cache_dtype=None) -> Engine:
    engine = Engine(config, slots=slots, sampling=SAMPLING, stop_ids=stop_ids, check_every=check_every,
                    kv_cache_dtype=kv_cache_dtype)
    engine.load(0, params)
    return engine


def _requests(n: int, seed: int = 0) -> list[Request]:
    """Varied contexts (1..8 tokens) and lengths (1..8 new tokens, all fit), each with its own key."""
    rng = np.random.default_rng(seed)
    return [Request(rng.integers(1, CONFIG.vocab_size, rng.integers(1, 9)).astype(np.int32),
                    max_new_tokens=int(rng.integers(1, 9)), key=jax.random.key(100 + i)) for i in range(n)]


def _drain(engine: Engine) -> dict[int, Completion]:
    done = {}
    while not engine.idle:
        for completion in engine.step():
            assert completion.id not in done
            done[completion.id] = completion
    return done


def _run(engine: Engine, requests: list[Request]) -> list[Completion]:
    """Submits `requests` together and steps until they all complete; their completions, in order."""
    ids = [engine.submit(r) for r in requests]
    done = _drain(engine)
    return [done[i] for i in ids]


def _next_token_logp(params, context, tokens) -> np.ndarray:
    """[k, V] log-probs of each new token's position by a no-cache forward over the whole sequence
    (padded to the window, which the causal mask hides from it: one compile)."""
    sequence = np.concatenate([context, tokens])
    padded = np.pad(sequence, (0, CONFIG.max_len - len(sequence))).astype(np.int32)[None]
    logits = _forward(params, padded, np.arange(CONFIG.max_len)[None], np.ones_like(padded))
    return np.asarray(jax.nn.log_softmax(logits[0]))[len(context) - 1: len(sequence) - 1]


def _full_forward_logprobs(params, context, tokens) -> np.ndarray:
    """log_softmax(logits)[token] of each new token, by `_next_token_logp`."""
    return np.take_along_axis(_next_token_logp(params, context, tokens), np.asarray(tokens)[:, None], 1)[:, 0]


def test_a_request_generates_the_same_alone_or_among_others(params):
    requests = _requests(12)
    alone = _engine(params[0], slots=1)
    solo = [_run(alone, [r])[0] for r in requests]
    for first in (5, 2):  # different batches, slots and arrival times
        crowded = _engine(params[0], slots=SLOTS)
        ids = [crowded.submit(r) for r in requests[:first]]
        done = {c.id: c for _ in range(2) for c in crowded.step()}
        ids += [crowded.submit(r) for r in requests[first:]]
        done.update(_drain(crowded))
        for i, expected in zip(ids, solo):
            np.testing.assert_array_equal(done[i].tokens, expected.tokens)
            np.testing.assert_allclose(done[i].logprobs, expected.logprobs, atol=1e-5)


def test_raw_key_data_draws_as_the_typed_key(params):
    typed = _requests(1)[0]
    raw = Request(typed.tokens, typed.max_new_tokens, np.asarray(jax.random.key_data(typed.key)))
    engine = _engine(params[0], slots=SLOTS)
    a, b = _run(engine, [typed])[0], _run(engine, [raw])[0]
    np.testing.assert_array_equal(a.tokens, b.tokens)


def test_logprobs_equal_a_full_forward(params):
    engine = _engine(params[0], slots=SLOTS)
    requests = _requests(6, seed=1)
    ids = [engine.submit(r) for r in requests]
    done = _drain(engine)
    for i, request in zip(ids, requests):
        c = done[i]
        assert len(c.tokens) == request.max_new_tokens and np.all(c.versions == 0) and not c.newer
        np.testing.assert_allclose(c.logprobs, _full_forward_logprobs(params[0], request.tokens, c.tokens),
                                   atol=1e-5)


def test_a_bfloat16_cache_under_float32_weights_keeps_the_log_probs_within_its_rounding(params):
    engine = _engine(params[0], slots=SLOTS, kv_cache_dtype="bfloat16")
    assert {str(x.dtype) for x in jax.tree.leaves(engine._state.cache)} == {"bfloat16"}
    requests = _requests(6, seed=1)
    gaps = []
    for request, c in zip(requests, _run(engine, requests)):
        assert len(c.tokens) == request.max_new_tokens
        gaps.append(np.abs(c.logprobs - _full_forward_logprobs(params[0], request.tokens, c.tokens)))
    gaps = np.concatenate(gaps)
    # Keys and values rounded to bfloat16 (8 bits of mantissa) moved a log-prob by at most
    # 8e-4 here: more than a float32 cache's 1e-5, and no more than a rounding does.
    assert 1e-5 < gaps.max() < 5e-3, gaps.max()


def test_greedy_sampling_takes_the_full_forward_argmax(params):
    engine = Engine(CONFIG, slots=SLOTS, sampling=SamplingParams(top_k=1), stop_ids=())
    engine.load(0, params[0])
    requests = _requests(4, seed=4)
    for request, c in zip(requests, _run(engine, requests)):
        np.testing.assert_array_equal(c.tokens, np.argmax(_next_token_logp(params[0], request.tokens, c.tokens), -1))
        np.testing.assert_allclose(c.logprobs, 0, atol=1e-6)  # all the mass on the one token kept


def test_a_greedy_engine_takes_the_argmax_and_shares_the_sampling_engines_decode(params):
    requests = _requests(4, seed=5)
    _run(_engine(params[0], slots=SLOTS), requests)  # the sampling engine's decode, compiled
    compiled = decode._cache_size()
    engine = Engine(CONFIG, slots=SLOTS, sampling=SAMPLING, stop_ids=(), greedy=True)
    engine.load(0, params[0])
    for request, c in zip(requests, _run(engine, requests)):
        logp = _next_token_logp(params[0], request.tokens, c.tokens)
        np.testing.assert_array_equal(c.tokens, np.argmax(logp, -1))
        np.testing.assert_allclose(c.logprobs, logp[np.arange(len(c.tokens)), c.tokens], atol=1e-5)
    assert decode._cache_size() == compiled  # an eval beside an actor compiles no decode of its own


def test_more_requests_than_slots_are_admitted_as_slots_free(params):
    engine = _engine(params[0], slots=SLOTS)
    requests = _requests(20, seed=2)
    ids = [engine.submit(r) for r in requests]
    assert (engine.pending, engine.active) == (20, 0)
    first = engine.step()  # admits four and returns as soon as one finishes
    assert 1 <= len(first) < 4 and (engine.pending, engine.active) == (16, 4 - len(first))
    second = engine.step()  # the freed slots take queued requests while the others still run
    assert engine.pending == 16 - len(first)
    assert not set(ids[:4]) <= {c.id for c in first + second}
    done = {c.id: c for c in first + second}
    done.update(_drain(engine))
    assert sorted(done) == ids and engine.pending == engine.active == 0
    assert all(len(done[i].tokens) == r.max_new_tokens for i, r in zip(ids, requests))


def test_a_one_token_request_completes_in_one_step(params):
    engine = _engine(params[0], slots=SLOTS)
    engine.submit(Request(np.array([1, 4], np.int32), max_new_tokens=1, key=jax.random.key(0)))
    (completion,) = engine.step()
    assert len(completion.tokens) == 1 and engine.idle


def test_stop_ids_and_a_full_window_end_a_request(params):
    every_token = tuple(range(CONFIG.vocab_size))
    engine = _engine(params[0], slots=SLOTS, stop_ids=every_token)
    assert all(len(c.tokens) == 1 for c in _run(engine, _requests(4)))
    stops = (3, 5)
    engine = _engine(params[0], slots=SLOTS, stop_ids=stops)
    completions = _run(engine, [Request(r.tokens, 8, r.key) for r in _requests(16, seed=3)])
    stopped = [c for c in completions if len(c.tokens) < 8]
    assert stopped and all(c.tokens[-1] in stops for c in stopped)
    assert all(not np.isin(c.tokens[:-1], stops).any() for c in completions)
    engine = _engine(params[0], slots=SLOTS)
    near_full = Request(np.ones(CONFIG.max_len - 2, np.int32), max_new_tokens=5, key=jax.random.key(0))
    assert [len(c.tokens) for c in _run(engine, [near_full])] == [2]


def test_followers_switch_at_a_check_boundary_and_pinned_requests_keep_their_weights(params):
    old, new = params
    engine = _engine(old, slots=SLOTS, check_every=4)
    follower = Request(np.array([1, 4], np.int32), max_new_tokens=12, key=jax.random.key(1))
    pinned = Request(np.array([1, 5, 6], np.int32), max_new_tokens=12, key=jax.random.key(2), version=0, params=old)
    short = Request(np.array([1, 7], np.int32), max_new_tokens=2, key=jax.random.key(3))
    f, p, s = (engine.submit(r) for r in (follower, pinned, short))
    (first,) = engine.step()  # `short` finishes after two decode steps: the chunk returns there
    assert first.id == s and not first.newer
    engine.load(1, new)  # mid-chunk: followers switch only at the next boundary, after 4 steps
    late = Request(np.array([1, 8], np.int32), max_new_tokens=3, key=jax.random.key(4))
    g = engine.submit(late)  # admitted with the latest weights right away
    done = _drain(engine)
    np.testing.assert_array_equal(done[f].versions, [0] * 4 + [1] * 8)
    np.testing.assert_array_equal(done[p].versions, [0] * 12)
    np.testing.assert_array_equal(done[g].versions, [1] * 3)
    assert done[f].newer and done[p].newer and not done[g].newer
    f_old = _full_forward_logprobs(old, follower.tokens, done[f].tokens)
    f_new = _full_forward_logprobs(new, follower.tokens, done[f].tokens)
    np.testing.assert_allclose(done[f].logprobs, np.concatenate([f_old[:4], f_new[4:]]), atol=1e-5)
    np.testing.assert_allclose(done[p].logprobs, _full_forward_logprobs(old, pinned.tokens, done[p].tokens),
                               atol=1e-5)
    np.testing.assert_allclose(done[g].logprobs, _full_forward_logprobs(new, late.tokens, done[g].tokens),
                               atol=1e-5)


def test_compiles_stay_within_the_bound():
    config = CONFIG.model_copy(update={"max_len": 32})  # shapes no other test compiles
    weights = [init_params(config, seed=0), init_params(config, seed=1)]
    engine = _engine(weights[0], slots=2, config=config, check_every=4)
    bound = 2 * 2  # whole contexts: K in {1, 2} times P in {16, 32} (suffixes: P in {2, 4, ..., 32})
    before = admit._cache_size(), decode._cache_size()
    rng = np.random.default_rng(0)

    def traffic(n, first_version):
        for i in range(n):
            version = first_version + i // 10
            engine.load(version, weights[version % 2])  # followers switch, several versions decode
            pinned = {"version": version - 1, "params": weights[(version - 1) % 2]} if i % 3 == 0 else {}
            engine.submit(Request(rng.integers(1, 9, rng.integers(1, 30)).astype(np.int32),
                                  max_new_tokens=int(rng.integers(1, 9)), key=jax.random.key(i), **pinned))
            if rng.random() < 0.5:
                engine.step()
        _drain(engine)

    for length in (5, 20):  # every whole-context (K, P) once
        _run(engine, [Request(np.ones(length, np.int32), 2, jax.random.key(k)) for k in range(2)])
        _run(engine, [Request(np.ones(length, np.int32), 2, jax.random.key(0))])
    assert engine.compiles == {"prefill": bound, "suffix": 0, "decode": 1}
    traffic(40, first_version=1)
    # Episodes whose turns add 1..4 tokens at many starts: a compile per (K, P), not per start.
    _play(engine, 8, 4, keyed=True, in_flight=2, new_tokens=(1, 3), observations=(0, 3))
    traffic(40, first_version=5)
    assert engine.compiles["prefill"] == bound and engine.compiles["decode"] == 1
    assert 2 <= engine.compiles["suffix"] <= 4 and engine.admitted["suffix"] >= 16  # K in {1, 2}, P in {2, 4}
    # Nothing compiled behind the count (a dtype, a weak type, a committed scalar, a start):
    assert (admit._cache_size() - before[0], decode._cache_size() - before[1]) == (
        engine.compiles["prefill"] + engine.compiles["suffix"], 1)


def test_a_long_context_is_prefilled_in_chunks_that_draw_the_same():
    config = CONFIG.model_copy(update={"max_len": 64})
    weights = init_params(config, seed=0)
    rng = np.random.default_rng(3)
    requests = [Request(rng.integers(1, config.vocab_size, n).astype(np.int32), max_new_tokens=6,
                        key=jax.random.key(i), prefix_key=i) for i, n in enumerate([50, 3, 33, 17, 58, 9])]
    engines = {}
    for budget in (16, 64):  # passes of at most 16 positions, one row each; or one pass of every row
        engine = Engine(config, slots=6, sampling=SAMPLING, stop_ids=(), prefill_tokens=budget)
        engine.load(0, weights)
        first = _run(engine, requests)
        # A second turn continues each episode on its warm prefix: a suffix of up to 25 tokens.
        later = [dataclasses.replace(r, tokens=np.concatenate([r.tokens, c.tokens, np.full(n, 5, np.int32)]),
                                     key=jax.random.key(10 + i))
                 for i, (r, c, n) in enumerate(zip(requests, first, [0, 25, 3, 25, 0, 2])) if i in (1, 2, 3, 5)]
        engines[budget] = engine, first + _run(engine, later)
    (chunked, got), (_, expected) = engines[16], engines[64]
    for a, b in zip(got, expected):
        np.testing.assert_array_equal(a.tokens, b.tokens)
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
    assert all(k * p <= 16 for k, p, _ in chunked._prefill_shapes)
    assert {p for _, p, _ in chunked.prefill_shapes()} <= {2, 4, 8, 16}
    assert chunked.admitted["suffix"] > 0


def test_after_warm_up_the_first_requests_compile_nothing_and_draw_the_same(params):
    """A warmed engine has compiled every shape its first episodes meet (whole contexts of
    any length, the suffixes of later turns, the decode): their clock never pays a compile."""
    config = CONFIG.model_copy(update={"max_len": 24})  # shapes no other test compiles
    weights = init_params(config, seed=0)
    cold = _engine(weights, slots=3, config=config)
    engine = _engine(weights, slots=3, config=config)
    assert engine.prefill_shapes(in_flight=2) == [(1, 16, False), (2, 16, False), (1, 24, False), (2, 24, False),
                                                  (1, 2, True), (2, 2, True), (1, 4, True), (2, 4, True),
                                                  (1, 8, True), (2, 8, True), (1, 16, True), (2, 16, True),
                                                  (1, 24, True), (2, 24, True)]
    assert engine.warm_up(in_flight=2) == 15
    warmed = engine.compiles, admit._cache_size(), decode._cache_size()
    assert warmed[0] == {"prefill": 4, "suffix": 10, "decode": 1} and engine.idle and engine.warm == 0
    requests = [Request(np.arange(1, n + 1, dtype=np.int32) % 6 + 1, 3, jax.random.key(n)) for n in (2, 9, 20)]
    for pair in (requests[:2], requests[2:]):  # first turns: 2 at once, then 1
        for got, expected in zip(_run(engine, pair), _run(cold, pair)):
            np.testing.assert_array_equal(got.tokens, expected.tokens)
            np.testing.assert_allclose(got.logprobs, expected.logprobs, atol=1e-5)
    _play(engine, 4, 4, keyed=True, in_flight=2, new_tokens=(1, 4), observations=(0, 6))  # later turns: suffixes
    assert engine.admitted["suffix"] >= 8
    assert (engine.compiles, admit._cache_size(), decode._cache_size()) == warmed
    with pytest.raises(RuntimeError, match="load"):
        Engine(config, slots=3, sampling=SAMPLING, stop_ids=()).warm_up()


def _play(engine: Engine, episodes: int, turns: int, *, keyed: bool, seed: int = 0, in_flight: int | None = None,
          new_tokens=(1, 3), observations=(1, 3)) -> dict[int, list[Completion]]:
    """Plays `episodes` multi-turn episodes, `in_flight` at once (default: all): a turn's request
    is the whole context so far (2 start tokens, then each action and a fake observation of
    `observations` tokens, a range), submitted as soon as the previous turn completes, asking
    for `new_tokens` (a range); its prefix key is the episode if `keyed`. Completions by episode."""
    rng = np.random.default_rng(seed)  # every draw by (episode, turn): the same in any completion order
    contexts = {e: rng.integers(1, CONFIG.vocab_size, 2).tolist() for e in range(episodes)}
    lengths_et = rng.integers(*new_tokens, (episodes, turns))
    observations_et = [[rng.integers(1, CONFIG.vocab_size, rng.integers(*observations)).tolist()
                        for _ in range(turns)] for _ in range(episodes)]
    done: dict[int, list[Completion]] = {e: [] for e in range(episodes)}
    waiting, queued = {}, list(range(episodes))[::-1]

    def submit(e: int) -> None:
        turn = len(done[e])
        request = Request(np.array(contexts[e], np.int32), int(lengths_et[e, turn]),
                          np.array([seed, 100 * e + turn], np.uint32), prefix_key=e if keyed else None)
        waiting[engine.submit(request)] = e

    while queued or waiting:
        while queued and len(waiting) < (in_flight or episodes):
            submit(queued.pop())
        for completion in engine.step():
            e = waiting.pop(completion.id)
            done[e].append(completion)
            contexts[e] += completion.tokens.tolist() + observations_et[e][len(done[e]) - 1]
            if len(done[e]) < turns and len(contexts[e]) < engine.max_len:
                submit(e)
    return done


def _assert_same_episodes(a: dict[int, list[Completion]], b: dict[int, list[Completion]]) -> None:
    assert a.keys() == b.keys()
    for e, turns in a.items():
        assert len(turns) == len(b[e])
        for x, y in zip(turns, b[e]):
            np.testing.assert_array_equal(x.tokens, y.tokens)
            np.testing.assert_array_equal(x.versions, y.versions)
            np.testing.assert_allclose(x.logprobs, y.logprobs, atol=1e-5)


def test_a_multi_turn_episode_prefills_only_its_new_tokens_and_draws_the_same(params):
    full, reused = _engine(params[0], slots=SLOTS), _engine(params[0], slots=SLOTS)
    expected = _play(full, SLOTS, 4, keyed=False)
    got = _play(reused, SLOTS, 4, keyed=True)
    _assert_same_episodes(got, expected)
    assert all(len(turns) == 4 for turns in got.values())
    assert full.admitted == {"full": 4 * SLOTS, "suffix": 0}
    assert reused.admitted == {"full": SLOTS, "suffix": 3 * SLOTS}  # every later turn onto its warm slot
    assert reused.warm == SLOTS and reused.idle


def test_more_episodes_than_slots_evict_the_least_recently_used(params):
    full, reused = _engine(params[0], slots=SLOTS), _engine(params[0], slots=SLOTS)
    for in_flight in (SLOTS, 10):  # every episode keeps its slot; and slots under pressure
        got = _play(reused, 10, 4, keyed=True, seed=in_flight, in_flight=in_flight)
        _assert_same_episodes(got, _play(full, 10, 4, keyed=False, seed=in_flight, in_flight=in_flight))
        assert all(len(turns) == 4 for turns in got.values()) and reused.warm <= SLOTS
    assert reused.admitted["suffix"] >= 30  # (all of the first round's later turns)
    engine, reference = _engine(params[0], slots=SLOTS), _engine(params[0], slots=SLOTS)
    turn1 = {e: Request(np.array([1, 2 + i], np.int32), 1, np.array([7, i], np.uint32), prefix_key=e)
             for i, e in enumerate("abcdef")}
    done = {e: _run(engine, [turn1[e]])[0] for e in "abcd"}  # one at a time: warm a, b, c, d
    engine.release("c")  # c's episode ended: its slot turns cold
    _run(engine, [turn1["e"]])  # takes c's slot
    _run(engine, [turn1["f"]])  # no cold slot left: evicts a, the least recently used
    turn2 = {e: dataclasses.replace(turn1[e], tokens=np.concatenate([turn1[e].tokens, done[e].tokens, [3]]))
             for e in "abd"}
    admitted = []
    for e in "adb":  # a, evicted, evicts b; d reuses its slot; b, evicted, evicts e
        (completion,) = _run(engine, [turn2[e]])
        admitted.append(engine.admitted["suffix"])
        _assert_drawn_as_by_a_full_prefill(reference, turn2[e], completion)
    assert admitted == [0, 1, 1] and engine.warm == SLOTS


def _assert_drawn_as_by_a_full_prefill(reference: Engine, request: Request, completion: Completion) -> None:
    """`completion` is what `request` draws with its whole context prefilled on `reference`."""
    (expected,) = _run(reference, [dataclasses.replace(request, prefix_key=None)])
    np.testing.assert_array_equal(completion.tokens, expected.tokens)
    np.testing.assert_array_equal(completion.versions, expected.versions)
    np.testing.assert_allclose(completion.logprobs, expected.logprobs, atol=1e-5)


def test_reuse_is_refused_unless_the_slot_holds_a_prefix_computed_by_the_same_weights(params):
    old, new = params
    engine, reference = _engine(old, slots=SLOTS), _engine(old, slots=SLOTS)
    first = Request(np.array([1, 2, 3], np.int32), 2, np.array([5, 0], np.uint32), prefix_key="x")
    (action,) = _run(engine, [first])
    held = np.concatenate([first.tokens, action.tokens[:-1]])  # the last token never reached the cache
    for tokens in (np.concatenate([[4], held[1:], [5, 6]]), held[:-1]):  # not a prefix; shorter than it
        _run(engine, [first])  # "x" holds `held`
        (completion,) = _run(engine, [dataclasses.replace(first, tokens=tokens)])
        assert engine.admitted["suffix"] == 0
        _assert_drawn_as_by_a_full_prefill(reference, dataclasses.replace(first, tokens=tokens), completion)
    # Exactly the tokens it holds: only the last one is recomputed, for its logits.
    _run(engine, [first])
    (completion,) = _run(engine, [dataclasses.replace(first, tokens=held)])
    assert engine.admitted["suffix"] == 1
    _assert_drawn_as_by_a_full_prefill(reference, dataclasses.replace(first, tokens=held), completion)
    # A follower after a newer version: its prefix is recomputed with the new weights.
    _run(engine, [first])
    engine.load(1, new)
    follower = dataclasses.replace(first, tokens=np.concatenate([held, action.tokens[-1:], [4]]))
    (completion,) = _run(engine, [follower])
    assert engine.admitted["suffix"] == 1 and np.all(completion.versions == 1)
    np.testing.assert_allclose(completion.logprobs, _full_forward_logprobs(new, follower.tokens, completion.tokens),
                               atol=1e-5)
    # A request pinned to the old version reuses a slot it warmed, not one of another version.
    pinned = dataclasses.replace(first, version=0, params=old, prefix_key="p")
    _run(engine, [pinned])
    (completion,) = _run(engine, [dataclasses.replace(pinned, tokens=follower.tokens)])
    assert engine.admitted["suffix"] == 2 and np.all(completion.versions == 0)
    np.testing.assert_allclose(completion.logprobs, _full_forward_logprobs(old, follower.tokens, completion.tokens),
                               atol=1e-5)
    _run(engine, [pinned])
    (completion,) = _run(engine, [dataclasses.replace(follower, prefix_key="p")])
    assert engine.admitted["suffix"] == 2 and np.all(completion.versions == 1)


def test_bad_requests_and_versions_raise(params):
    engine = Engine(CONFIG, slots=2, sampling=SAMPLING, stop_ids=())
    key = jax.random.key(0)
    engine.submit(Request(np.array([1], np.int32), 1, key))
    with pytest.raises(RuntimeError, match="load"):
        engine.step()
    for bad in (Request(np.zeros(0, np.int32), 1, key), Request(np.ones(CONFIG.max_len, np.int32), 1, key),
                Request(np.array([1], np.int32), 0, key), Request(np.array([1], np.int32), 1, key, version=3),
                Request(np.array([1], np.int32), 1, np.zeros(3, np.uint32))):
        with pytest.raises(ValueError):
            engine.submit(bad)
    with pytest.raises(TypeError, match="hashable"):
        engine.submit(Request(np.array([1], np.int32), 1, key, prefix_key=["an", "episode"]))
    engine.load(2, params[0])
    engine.load(2, params[0])  # the same version again: nothing to do
    with pytest.raises(ValueError, match="older"):
        engine.load(1, params[1])
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        Engine(CONFIG, slots=1, sampling=SAMPLING, stop_ids=(), kv_cache_dtype="float16")


@pytest.mark.parametrize("dtype, kv_cache_dtype", [("float32", None), ("bfloat16", None), ("float32", "bfloat16")])
def test_the_kv_cache_is_what_its_shape_says(dtype, kv_cache_dtype):
    config = CONFIG.model_copy(update={"n_layers": 2, "dtype": dtype})
    engine = Engine(config, slots=3, sampling=SAMPLING, stop_ids=(), kv_cache_dtype=kv_cache_dtype)
    assert config.kv_bytes_per_position() == 2 * 2 * 1 * 16 * (4 if dtype == "float32" else 2)
    itemsize = 2 if "bfloat16" in (dtype, kv_cache_dtype) else 4
    assert config.kv_bytes_per_position(kv_cache_dtype) == 2 * 2 * 1 * 16 * itemsize
    assert engine.device_bytes["kv_cache"] == 3 * 16 * 2 * 2 * 1 * 16 * itemsize
    assert engine.device_bytes["slots"] > engine.device_bytes["kv_cache"] and engine.device_bytes["weights"] == 0
    engine.load(0, init_params(config, 0))
    assert engine.device_bytes["weights"] == sum(x.size * 4 for x in jax.tree.leaves(init_params(config, 0)))
