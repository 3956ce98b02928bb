import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from learner.batching import make_batch, pack_rows
from learner.trajectory import Sample


def _sample(tokens, n_prompt, first_logprob=-1.0):
    """A sample whose first `n_prompt` tokens are observations, the rest generated."""
    n = len(tokens)
    versions = np.where(np.arange(n) < n_prompt, -1, 3).astype(np.int32)
    logprobs = np.where(versions >= 0, first_logprob - np.arange(n) / 10, 0.0).astype(np.float32)
    return Sample(np.array(tokens, np.int32), logprobs, versions, reward=0.0)


A = _sample([1, 10, 11, 12, 13], n_prompt=2)  # 5 tokens, 11, 12 and 13 generated
B = _sample([1, 20, 21], n_prompt=1, first_logprob=-2.0)  # 3 tokens, 20 and 21 generated
C = _sample([1, 30], n_prompt=1)  # 2 tokens, 30 generated


def test_packs_first_fit_decreasing_into_the_smallest_bucket():
    batch = make_batch([C, A, B], [0.5, 1.0, -1.0], buckets=(4, 8, 16), rows=2)
    # Bucket 4 is too short for A; in 8, A and B fill row 0 and C goes to row 1.
    assert batch.shape == (2, 8)
    np.testing.assert_array_equal(batch.tokens, [[1, 10, 11, 12, 13, 1, 20, 21], [1, 30, 0, 0, 0, 0, 0, 0]])
    np.testing.assert_array_equal(batch.positions, [[0, 1, 2, 3, 4, 0, 1, 2], [0, 1, 0, 0, 0, 0, 0, 0]])
    np.testing.assert_array_equal(batch.segment_ids, [[1, 1, 1, 1, 1, 2, 2, 2], [1, 1, 0, 0, 0, 0, 0, 0]])
    np.testing.assert_array_equal(batch.targets, [[10, 11, 12, 13, 0, 20, 21, 0], [30, 0, 0, 0, 0, 0, 0, 0]])
    np.testing.assert_array_equal(batch.loss_mask, [[0, 1, 1, 1, 0, 1, 1, 0], [1, 0, 0, 0, 0, 0, 0, 0]])
    np.testing.assert_allclose(
        batch.behaviour_logprobs,
        [[0, -1.2, -1.3, -1.4, 0, -2.1, -2.2, 0], [-1.1, 0, 0, 0, 0, 0, 0, 0]],
        rtol=1e-6,
    )
    np.testing.assert_array_equal(batch.advantages, [[1, 1, 1, 1, 1, -1, -1, -1], [0.5, 0.5, 0, 0, 0, 0, 0, 0]])
    assert batch.padding == pytest.approx(6 / 16)
    assert batch.n_sequences == 3


def test_dtypes_are_fixed():
    batch = make_batch([A], [1.0], buckets=(8,), rows=1)
    for name in ("tokens", "positions", "segment_ids", "targets"):
        assert getattr(batch, name).dtype == np.int32
    for name in ("loss_mask", "behaviour_logprobs", "advantages"):
        assert getattr(batch, name).dtype == np.float32


def test_fewer_rows_take_a_longer_bucket():
    batch = make_batch([C, A, B], [0.0] * 3, buckets=(4, 8, 16), rows=1)
    assert batch.shape == (1, 16)
    assert batch.padding == pytest.approx(6 / 16)


def test_an_unfillable_bucket_is_skipped_even_if_every_sample_fits_it():
    # Three samples of 3 fit bucket 4 one by one but not in 2 rows of it.
    batch = make_batch([B, B, B], [0.0] * 3, buckets=(4, 8), rows=2)
    assert batch.shape == (2, 8)


def test_sample_longer_than_the_largest_bucket_raises():
    with pytest.raises(ValueError, match=r"length 5 exceeds the largest bucket \(4\)"):
        make_batch([A], [0.0], buckets=(2, 4), rows=4)


def test_samples_that_do_not_fit_in_the_rows_raise():
    with pytest.raises(ValueError, match=r"do not fit in 1 rows of the largest bucket \(8\)"):
        make_batch([A, A], [0.0, 0.0], buckets=(8,), rows=1)


def test_mismatched_advantages_raise():
    with pytest.raises(ValueError, match="2 samples but 1 advantages"):
        make_batch([A, B], [0.0], buckets=(8,), rows=1)


def test_pack_rows_reports_no_fit():
    assert pack_rows([3, 3, 3], 4, 2) is None
    assert pack_rows([1, 3, 2, 2], 4, 2) == [[1, 0], [2, 3]]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 12), min_size=1, max_size=12), st.integers(1, 4))
def test_every_sample_is_packed_once_and_intact(lengths, rows):
    rng = np.random.default_rng(len(lengths))
    samples = [_sample(rng.integers(3, 50, n), n_prompt=1) for n in lengths]
    try:
        batch = make_batch(samples, list(range(len(samples))), buckets=(12, 24, 48), rows=rows)
    except ValueError:
        assert sum(lengths) > rows * 48 or pack_rows(lengths, 48, rows) is None
        return
    recovered = {}
    for r in range(rows):
        for segment in range(1, batch.segment_ids[r].max() + 1):
            where = batch.segment_ids[r] == segment
            np.testing.assert_array_equal(batch.positions[r][where], np.arange(where.sum()))
            recovered[int(batch.advantages[r][where][0])] = batch.tokens[r][where]
    assert sorted(recovered) == list(range(len(samples)))
    for i, sample in enumerate(samples):
        np.testing.assert_array_equal(recovered[i], sample.tokens)
    assert batch.padding == pytest.approx(1 - sum(lengths) / batch.tokens.size)


def test_split_gives_contiguous_minibatches_of_rows():
    batch = make_batch([C, A, B, C], [0.0] * 4, buckets=(8,), rows=4)
    halves = batch.split(2)
    assert [h.shape for h in halves] == [(2, 8), (2, 8)]
    np.testing.assert_array_equal(np.concatenate([h.tokens for h in halves]), batch.tokens)
    with pytest.raises(ValueError, match=r"rows \(4\) must be divisible by minibatches \(3\)"):
        batch.split(3)


def test_loss_positions_are_the_trained_ones_padded_to_a_quarter_or_a_half_of_the_row():
    from learner.batching import loss_positions

    mask = np.zeros((2, 16), np.float32)
    mask[0, [3, 4, 9]] = 1
    mask[1, [15]] = 1
    assert loss_positions(mask).tolist() == [[0, 3, 4, 9], [0, 1, 2, 15]]  # K = 4, others fill in order
    mask[0, 10:13] = 1  # 6 trained: a half
    assert loss_positions(mask).shape == (2, 8) and set(np.nonzero(mask[0])[0]) <= set(loss_positions(mask)[0])
    mask[1, :9] = 1  # 10 of 16: the head runs everywhere
    assert loss_positions(mask) is None
    assert loss_positions(np.zeros((1, 16), np.float32)).shape == (1, 4)
