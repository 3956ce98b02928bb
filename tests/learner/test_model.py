import jax
import jax.numpy as jnp
import numpy as np
import pytest

from learner.config import ModelConfig
from learner import model as model_lib
from learner.model import apply_rope, attention_mask, cached_attention, causal_attention, forward_fn, init_params

CONFIG = ModelConfig(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64)


@pytest.fixture(scope="module")
def model():
    return jax.jit(forward_fn(CONFIG)), init_params(CONFIG, seed=0)


def _row(*sequences, length):
    """tokens, positions, segment_ids [1, length] of `sequences` packed in one row."""
    tokens, positions, segments = (np.zeros((1, length), np.int32) for _ in range(3))
    start = 0
    for segment, seq in enumerate(sequences, start=1):
        span = slice(start, start + len(seq))
        tokens[0, span], positions[0, span], segments[0, span] = seq, np.arange(len(seq)), segment
        start += len(seq)
    return tokens, positions, segments


def test_logits_shape_and_dtype(model):
    forward, params = model
    tokens, positions, segments = _row([1, 5, 6], [1, 7], length=8)
    logits = forward(params, tokens, positions, segments)
    assert logits.shape == (1, 8, CONFIG.vocab_size) and logits.dtype == jnp.float32
    assert np.all(np.isfinite(logits))  # padding rows attend to nothing, still finite


def test_segments_do_not_see_each_other(model):
    forward, params = model
    logits = forward(params, *_row([1, 5, 6, 7], [1, 8, 9], length=8))
    changed = forward(params, *_row([1, 5, 6, 7], [1, 8, 40], length=8))
    np.testing.assert_array_equal(logits[0, :4], changed[0, :4])
    assert not np.allclose(logits[0, 6], changed[0, 6])


def test_attention_is_causal(model):
    forward, params = model
    logits = forward(params, *_row([1, 5, 6, 7, 8], length=8))
    changed = forward(params, *_row([1, 5, 6, 40, 8], length=8))
    np.testing.assert_array_equal(logits[0, :3], changed[0, :3])
    assert not np.allclose(logits[0, 3], changed[0, 3])


def test_packed_sequence_has_the_logits_it_has_alone(model):
    forward, params = model
    first, second = [1, 5, 6, 7, 8], [1, 9, 10, 11, 12, 13, 14]
    packed = forward(params, *_row(first, second, length=16))
    alone_first = forward(params, *_row(first, length=16))
    alone_second = forward(params, *_row(second, length=16))
    np.testing.assert_allclose(packed[0, :5], alone_first[0, :5], atol=1e-5)
    np.testing.assert_allclose(packed[0, 5:12], alone_second[0, :7], atol=1e-5)


@pytest.mark.parametrize("n_kv_heads", [1, 2, 4])
def test_grouped_query_attention_shapes(n_kv_heads):
    config = CONFIG.model_copy(update={"n_kv_heads": n_kv_heads})
    params = init_params(config, seed=0)
    attn = params["blocks"][0]["attn"]
    head_dim = config.d_model // config.n_heads
    assert attn["q"]["kernel"].shape == (config.d_model, config.n_heads * head_dim)
    assert attn["k"]["kernel"].shape == (config.d_model, n_kv_heads * head_dim)
    assert attn["v"]["kernel"].shape == (config.d_model, n_kv_heads * head_dim)
    assert attn["o"]["kernel"].shape == (config.n_heads * head_dim, config.d_model)
    logits = forward_fn(config)(params, *_row([1, 5, 6], length=4))
    assert logits.shape == (1, 4, config.vocab_size)


def test_grouped_query_attention_equals_multi_head_with_shared_keys_and_values(model):
    forward, params = model
    head_dim = CONFIG.d_model // CONFIG.n_heads
    repeats = CONFIG.n_heads // CONFIG.n_kv_heads
    mha_config = CONFIG.model_copy(update={"n_kv_heads": CONFIG.n_heads})
    mha_params = jax.tree.map(lambda x: x, params)
    for block in mha_params["blocks"].values():
        for name in ("k", "v"):
            kernel = block["attn"][name]["kernel"].reshape(CONFIG.d_model, CONFIG.n_kv_heads, head_dim)
            # Query head h reads key/value head h // repeats, as in Llama's repeat_kv.
            block["attn"][name]["kernel"] = jnp.repeat(kernel, repeats, axis=1).reshape(CONFIG.d_model, -1)
    row = _row([1, 5, 6, 7, 8], length=8)
    np.testing.assert_allclose(forward_fn(mha_config)(mha_params, *row), forward(params, *row), atol=1e-5)


def test_untied_embeddings_add_an_output_head():
    assert "lm_head" not in init_params(CONFIG, seed=0)
    untied = init_params(CONFIG.model_copy(update={"tie_embeddings": False}), seed=0)
    assert untied["lm_head"]["kernel"].shape == (CONFIG.d_model, CONFIG.vocab_size)


def test_bfloat16_compute_returns_float32_logits_close_to_float32(model):
    forward, params = model
    row = _row([1, 5, 6, 7], length=4)
    bf16 = jax.jit(forward_fn(CONFIG.model_copy(update={"dtype": "bfloat16"})))(params, *row)
    assert bf16.dtype == jnp.float32
    np.testing.assert_allclose(bf16, forward(params, *row), atol=0.05)


def test_forward_accepts_numpy_params_and_is_differentiable(model):
    forward, params = model
    row = _row([1, 5, 6], length=4)
    np.testing.assert_allclose(forward_fn(CONFIG)(jax.device_get(params), *row), forward(params, *row), atol=1e-5)
    grads = jax.grad(lambda p: forward(p, *row).sum())(params)
    assert jax.tree.structure(grads) == jax.tree.structure(params)


def test_init_is_seeded():
    a, b, c = (init_params(CONFIG, seed=s)["embed"]["embedding"] for s in (0, 0, 1))
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)


def test_rope_makes_attention_scores_depend_on_relative_position_only():
    rng = np.random.default_rng(0)
    q, k = (jnp.asarray(rng.normal(size=(1, 1, 1, 8)), jnp.float32) for _ in range(2))

    def score(pos_q, pos_k):
        rotated_q = apply_rope(q, jnp.array([[pos_q]]), 10_000.0)
        rotated_k = apply_rope(k, jnp.array([[pos_k]]), 10_000.0)
        return float(jnp.sum(rotated_q * rotated_k))

    assert score(5, 2) == pytest.approx(score(13, 10), rel=1e-4)
    assert score(5, 2) != pytest.approx(score(5, 4), rel=1e-4)


def test_cached_attention_row_by_row_equals_one_batched_product_and_jax_s_attention(monkeypatch):
    """On CPU the rows go one at a time (`lax.map`); the values are the batched product's and
    those of `jax.nn.dot_product_attention` over the same keys (grouped heads, a mask)."""
    b, t, h, k, s, d = 3, 2, 6, 2, 10, 8
    keys = jax.random.split(jax.random.key(0), 3)
    q = jax.random.normal(keys[0], (b, t, h, d))
    k_bksd, v_bksd = (jax.random.normal(key, (b, k, s, d)) for key in keys[1:])
    positions = jnp.array([[3, 4], [8, 9], [0, 1]])
    mask = jnp.arange(s)[None, None, None, :] <= positions[:, None, :, None]  # [B, 1, T, S]
    monkeypatch.setattr(model_lib, "_ROWS_FROM_BYTES", 0)  # this small cache would stay batched
    rows = jax.jit(cached_attention)(q, k_bksd, v_bksd, mask)
    batched = jax.jit(model_lib._attention)(q, k_bksd, v_bksd, mask)
    expected = jax.nn.dot_product_attention(q, k_bksd.transpose(0, 2, 1, 3), v_bksd.transpose(0, 2, 1, 3), mask=mask)
    assert "while" in jax.jit(cached_attention).lower(q, k_bksd, v_bksd, mask).as_text()  # one row at a time here
    np.testing.assert_allclose(rows, batched, atol=1e-6)
    np.testing.assert_allclose(rows, expected, atol=1e-5)
    monkeypatch.setattr(model_lib, "_ROWS_FROM_BYTES", 4 << 20)
    lowered = jax.jit(lambda *args: cached_attention(*args)).lower(q, k_bksd, v_bksd, mask)  # traced anew
    assert "while" not in lowered.as_text()  # a small cache: one batched product


def test_causal_attention_in_chunks_equals_jax_s_attention_over_the_whole_row():
    """Over a row longer than two chunks (the last one short), packed sequences and padding:
    the values and gradients of `jax.nn.dot_product_attention`'s full square, wherever a
    token is real (padding queries see nothing and are read by nothing)."""
    b, length, h, k, d = 2, 2 * model_lib._QUERY_CHUNK + 44, 6, 2, 8
    keys = jax.random.split(jax.random.key(0), 4)
    q = jax.random.normal(keys[0], (b, length, h, d))
    k_blkd, v_blkd = (jax.random.normal(key, (b, length, k, d)) for key in keys[1:3])
    segments = np.ones((b, length), np.int32)
    segments[0, 100:] = 2  # a second sequence across the first chunk's end
    segments[1, -30:] = 0  # padding
    mask = attention_mask(jnp.asarray(segments))
    real = jnp.asarray(segments != 0)[:, :, None, None]
    cotangent = jax.random.normal(keys[3], q.shape) * real

    def both(attend):
        fn = lambda q, k, v: attend(q, k, v, mask)
        return fn(q, k_blkd, v_blkd), jax.grad(lambda *x: jnp.sum(fn(*x) * cotangent), argnums=(0, 1, 2))(q, k_blkd, v_blkd)

    (out, grads), (want, want_grads) = both(jax.jit(causal_attention)), both(
        lambda q, k, v, m: jax.nn.dot_product_attention(q, k, v, mask=m))
    np.testing.assert_allclose(out * real, want * real, atol=1e-5)
    for grad, want_grad in zip(grads, want_grads):
        np.testing.assert_allclose(grad, want_grad, atol=1e-5)
    assert jax.jit(causal_attention).lower(q, k_blkd, v_blkd, mask).as_text().count("dot_general") == 2 * 3  # 3 chunks
