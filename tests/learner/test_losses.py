import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from learner.config import LossConfig
from learner.losses import group_advantages, policy_loss, token_entropy, token_logprobs

CONFIG = LossConfig(clip_low=0.2, clip_high=0.28)

# Two rows of four tokens. Row 0 packs two sequences, row 1 one sequence and padding.
RATIO = np.array([[1.5, 0.5, 1.0, 3.0], [1.0, 0.5, 1.2, 1.0]], np.float32)
ADVANTAGES = np.array([[1.0, 1.0, -2.0, -2.0], [-1.0, -1.0, -1.0, 0.0]], np.float32)
LOSS_MASK = np.array([[1, 1, 1, 0], [0, 1, 1, 0]], np.float32)
SEGMENT_IDS = np.array([[1, 1, 2, 2], [1, 1, 1, 0]], np.int32)
BEHAVIOUR = np.full((2, 4), -1.3, np.float32)
LOGPROBS = BEHAVIOUR + np.log(RATIO)
# Per-token objective on the masked tokens, by hand: 1.5 clipped to 1.28 (high side),
# 0.5 * 1 unclipped, 1.0 * -2, 0.5 clipped to 0.8 times -1 (low side), 1.2 * -1.
OBJECTIVES = [1.28, 0.5, -2.0, -0.8, -1.2]


def _run(jitted, fn, *args, **kwargs):
    fn = functools.partial(fn, **kwargs)
    return (jax.jit(fn) if jitted else fn)(*args)


@pytest.mark.parametrize("jitted", [False, True])
def test_group_advantages_normalised(jitted):
    rewards = jnp.array([[1.0, 0.0, 0.0, 1.0], [2.0, 2.0, 2.0, 2.0], [3.0, 0.0, 0.0, 1.0]])
    got = _run(jitted, group_advantages, rewards, normalize_std=True)
    std = np.sqrt(np.mean((np.array([3.0, 0, 0, 1]) - 1.0) ** 2))
    want = [[1.0, -1.0, -1.0, 1.0], [0.0, 0.0, 0.0, 0.0], np.array([2.0, -1.0, -1.0, 0.0]) / std]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("jitted", [False, True])
def test_group_advantages_centred_only(jitted):
    rewards = jnp.array([[1.0, 0.0, 0.0, 1.0], [2.0, 2.0, 2.0, 2.0]])
    got = _run(jitted, group_advantages, rewards, normalize_std=False)
    np.testing.assert_allclose(got, [[0.5, -0.5, -0.5, 0.5], [0.0] * 4], atol=1e-7)


def test_group_advantages_keeps_numpy_off_the_accelerator():
    got = group_advantages(np.array([[1.0, 3.0]]), normalize_std=True)
    assert isinstance(got, np.ndarray)
    np.testing.assert_allclose(got, [[-1.0, 1.0]], atol=1e-5)


def test_group_advantages_rejects_flat_rewards():
    with pytest.raises(ValueError, match="groups, group_size"):
        group_advantages(np.zeros(4), normalize_std=True)


def _reference_objective(logprobs, behaviour, advantages, config):
    ratio = np.exp(logprobs - behaviour)
    clipped = np.clip(ratio, 1 - config.clip_low, 1 + config.clip_high)
    return np.minimum(ratio * advantages, clipped * advantages)


def test_reference_objective_matches_hand_computation():
    objective = _reference_objective(LOGPROBS, BEHAVIOUR, ADVANTAGES, CONFIG)
    np.testing.assert_allclose(objective[LOSS_MASK > 0], OBJECTIVES, rtol=1e-5)


@pytest.mark.parametrize("jitted", [False, True])
def test_policy_loss_token_mean(jitted):
    args = (LOGPROBS, BEHAVIOUR, ADVANTAGES, LOSS_MASK, SEGMENT_IDS)
    loss, metrics = _run(jitted, policy_loss, *args, config=CONFIG)
    np.testing.assert_allclose(loss, -np.mean(OBJECTIVES), rtol=1e-5)
    np.testing.assert_allclose(metrics["clip_fraction"], 2 / 5, rtol=1e-6)
    np.testing.assert_allclose(metrics["ratio_mean"], (1.5 + 0.5 + 1.0 + 0.5 + 1.2) / 5, rtol=1e-5)
    np.testing.assert_allclose(metrics["approx_kl"], -np.log([1.5, 0.5, 1.0, 0.5, 1.2]).mean(), rtol=1e-5)
    np.testing.assert_allclose(metrics["ratio_max"], 1.5, rtol=1e-5)  # the masked 3.0 is excluded


@pytest.mark.parametrize("jitted", [False, True])
def test_policy_loss_sequence_mean(jitted):
    config = CONFIG.model_copy(update={"aggregation": "sequence-mean"})
    args = (LOGPROBS, BEHAVIOUR, ADVANTAGES, LOSS_MASK, SEGMENT_IDS)
    loss, _ = _run(jitted, policy_loss, *args, config=config)
    per_sequence = [np.mean(OBJECTIVES[:2]), OBJECTIVES[2], np.mean(OBJECTIVES[3:])]
    np.testing.assert_allclose(loss, -np.mean(per_sequence), rtol=1e-5)


@pytest.mark.parametrize("aggregation", ["token-mean", "sequence-mean"])
def test_policy_loss_ignores_unmasked_tokens(aggregation):
    config = CONFIG.model_copy(update={"aggregation": aggregation})
    loss, _ = policy_loss(LOGPROBS, BEHAVIOUR, ADVANTAGES, LOSS_MASK, SEGMENT_IDS, config)
    noisy = np.where(LOSS_MASK > 0, LOGPROBS, 50.0)  # huge ratios where the mask is 0
    noisy_advantages = np.where(LOSS_MASK > 0, ADVANTAGES, -7.0)
    loss2, _ = policy_loss(noisy, BEHAVIOUR, noisy_advantages, LOSS_MASK, SEGMENT_IDS, config)
    np.testing.assert_allclose(loss, loss2, rtol=1e-6)


def test_policy_loss_gradient_flows_only_through_unclipped_masked_tokens():
    def loss_fn(logprobs):
        return policy_loss(logprobs, BEHAVIOUR, ADVANTAGES, LOSS_MASK, SEGMENT_IDS, CONFIG)[0]

    grad = np.asarray(jax.grad(loss_fn)(jnp.asarray(LOGPROBS)))
    # d/dlogp of -(ratio * A) / 5 where unclipped; 0 where clipped or masked.
    want = np.zeros((2, 4), np.float32)
    want[0, 1], want[0, 2], want[1, 2] = -0.5 * 1.0 / 5, -1.0 * -2.0 / 5, -1.2 * -1.0 / 5
    np.testing.assert_allclose(grad, want, rtol=1e-5, atol=1e-7)


def test_policy_loss_with_no_trained_tokens_is_zero():
    loss, metrics = policy_loss(LOGPROBS, BEHAVIOUR, ADVANTAGES, np.zeros_like(LOSS_MASK), SEGMENT_IDS, CONFIG)
    assert float(loss) == 0.0 and all(np.isfinite(float(v)) for v in metrics.values())


def test_policy_loss_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="one shape"):
        policy_loss(LOGPROBS, BEHAVIOUR[:, :3], ADVANTAGES, LOSS_MASK, SEGMENT_IDS, CONFIG)


def test_token_logprobs_and_entropy_match_numpy():
    logits = np.random.default_rng(0).normal(size=(2, 3, 5)).astype(np.float32)
    targets = np.array([[0, 4, 2], [1, 1, 3]], np.int32)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    want = np.take_along_axis(logp, targets[..., None], -1)[..., 0]
    np.testing.assert_allclose(token_logprobs(jnp.asarray(logits), jnp.asarray(targets)), want, rtol=1e-5)
    np.testing.assert_allclose(token_entropy(jnp.asarray(logits)), -(np.exp(logp) * logp).sum(-1), rtol=1e-5)
    with pytest.raises(ValueError, match="targets"):
        token_logprobs(jnp.asarray(logits), jnp.asarray(targets[:, :2]))


def test_token_logprobs_gradient_is_weight_times_onehot_minus_softmax():
    """The hand-written gradient: g (onehot(target) - softmax), in the logits' dtype."""
    logits = np.random.default_rng(1).normal(size=(2, 3, 5)).astype(np.float32) * 3
    logits[0, 0, 2] = -np.inf  # a masked id: probability 0, gradient 0
    targets = np.array([[0, 4, 2], [1, 1, 3]], np.int32)
    weights = np.random.default_rng(2).normal(size=(2, 3)).astype(np.float32)
    grad = jax.grad(lambda x: jnp.sum(weights * token_logprobs(x, jnp.asarray(targets))))(jnp.asarray(logits))
    softmax = np.exp(logits - logits.max(-1, keepdims=True))
    softmax /= softmax.sum(-1, keepdims=True)
    want = weights[..., None] * (np.eye(5)[targets] - softmax)
    np.testing.assert_allclose(grad, want, atol=1e-6)
    assert grad[0, 0, 2] == 0
    narrow = jax.grad(lambda x: jnp.sum(token_logprobs(x, jnp.asarray(targets))))(jnp.asarray(logits, jnp.bfloat16))
    assert narrow.dtype == jnp.bfloat16


# Off-policy corrections on one row of four trained tokens. The behaviour policy mu
# is stale: pi / mu is 0.5, 1, 4 and 10, so with is_cap=2 the last two are capped.
PI_OVER_MU = np.array([[0.5, 1.0, 4.0, 10.0]], np.float32)
OFF_ADVANTAGES = np.array([[1.0, -1.0, 1.0, -1.0]], np.float32)
OFF_MASK = np.ones((1, 4), np.float32)
OFF_SEGMENTS = np.ones((1, 4), np.int32)
OFF_BEHAVIOUR = np.full((1, 4), -2.0, np.float32)
OFF_LOGPROBS = OFF_BEHAVIOUR + np.log(PI_OVER_MU)
# decoupled PPO: pi_prox / mu and pi / pi_prox.
PROX_OVER_MU = np.array([[1.0, 2.0, 4.0, 0.5]], np.float32)
PI_OVER_PROX = np.array([[1.5, 0.5, 1.0, 1.1]], np.float32)
PROX_LOGPROBS = OFF_BEHAVIOUR + np.log(PROX_OVER_MU)
PROX_CURRENT = PROX_LOGPROBS + np.log(PI_OVER_PROX)


def _reference_loss(logprobs, behaviour, advantages, mask, config, proximal=None, reference=None):
    """NumPy policy_loss, token-mean."""
    anchor = {"ppo": behaviour, "tis": logprobs, "decoupled-ppo": proximal}[config.objective]
    weights = np.exp(anchor - behaviour)
    if config.is_cap is not None:
        weights = np.minimum(weights, config.is_cap)
    ratio = np.exp(logprobs - anchor)
    clipped = np.clip(ratio, 1 - config.clip_low, 1 + config.clip_high)
    objective = weights * np.minimum(ratio * advantages, clipped * advantages)
    loss = -np.sum(objective * mask) / mask.sum()
    if config.kl_coef:
        d = reference - logprobs
        loss += config.kl_coef * np.sum((np.exp(d) - d - 1) * mask) / mask.sum()
    return loss


@pytest.mark.parametrize("jitted", [False, True])
def test_truncated_importance_sampling_caps_stale_tokens(jitted):
    config = CONFIG.model_copy(update={"objective": "tis", "is_cap": 2.0})
    args = (OFF_LOGPROBS, OFF_BEHAVIOUR, OFF_ADVANTAGES, OFF_MASK, OFF_SEGMENTS)
    loss, metrics = _run(jitted, policy_loss, *args, config=config)
    # Weights 0.5, 1, 2 (4 capped), 2 (10 capped); the ratio to pi itself is 1, never clipped.
    by_hand = -np.mean([0.5 * 1, 1 * -1, 2 * 1, 2 * -1])
    np.testing.assert_allclose(loss, by_hand, rtol=1e-5)
    np.testing.assert_allclose(loss, _reference_loss(*args[:4], config), rtol=1e-5)
    np.testing.assert_allclose(metrics["is_capped_fraction"], 0.5, rtol=1e-6)
    np.testing.assert_allclose(metrics["is_weight_mean"], (0.5 + 1 + 2 + 2) / 4, rtol=1e-5)
    np.testing.assert_allclose(metrics["clip_fraction"], 0.0, atol=1e-7)


def test_truncated_importance_sampling_gradient_is_the_weighted_policy_gradient():
    config = CONFIG.model_copy(update={"objective": "tis", "is_cap": 2.0})
    grad = jax.grad(lambda lp: policy_loss(lp, OFF_BEHAVIOUR, OFF_ADVANTAGES, OFF_MASK, OFF_SEGMENTS, config)[0])
    # d/dlogp of -mean(w * A * log pi), w held fixed.
    want = -np.array([[0.5 * 1, 1 * -1, 2 * 1, 2 * -1]]) / 4
    np.testing.assert_allclose(grad(jnp.asarray(OFF_LOGPROBS)), want, rtol=1e-5)


@pytest.mark.parametrize("jitted", [False, True])
def test_decoupled_ppo_clips_around_the_proximal_policy_and_caps_its_weight(jitted):
    config = CONFIG.model_copy(update={"objective": "decoupled-ppo", "is_cap": 3.0})
    args = (PROX_CURRENT, OFF_BEHAVIOUR, OFF_ADVANTAGES, OFF_MASK, OFF_SEGMENTS)
    loss, metrics = _run(jitted, policy_loss, *args, config=config, proximal_logprobs=PROX_LOGPROBS)
    # Weights 1, 2, 3 (4 capped), 0.5; objectives min(r A, clip(r) A): 1.28 (clipped
    # high), -0.8 (0.5 clipped low, A < 0), 1, -1.1.
    by_hand = -np.mean([1 * 1.28, 2 * -0.8, 3 * 1.0, 0.5 * -1.1])
    np.testing.assert_allclose(loss, by_hand, rtol=1e-5)
    np.testing.assert_allclose(loss, _reference_loss(*args[:4], config, proximal=PROX_LOGPROBS), rtol=1e-5)
    np.testing.assert_allclose(metrics["clip_fraction"], 2 / 4, rtol=1e-6)
    np.testing.assert_allclose(metrics["is_capped_fraction"], 1 / 4, rtol=1e-6)


def test_decoupled_ppo_at_the_proximal_weights_is_truncated_importance_sampling():
    tis = CONFIG.model_copy(update={"objective": "tis", "is_cap": 2.0})
    decoupled = tis.model_copy(update={"objective": "decoupled-ppo"})

    def loss(config, logprobs):
        proximal = jax.lax.stop_gradient(logprobs)
        args = (OFF_BEHAVIOUR, OFF_ADVANTAGES, OFF_MASK, OFF_SEGMENTS, config)
        return policy_loss(logprobs, *args, proximal_logprobs=proximal)[0]

    logprobs = jnp.asarray(OFF_LOGPROBS)
    for fn in (loss, jax.grad(loss, argnums=1)):
        np.testing.assert_allclose(fn(decoupled, logprobs), fn(tis, logprobs), rtol=1e-6)


@pytest.mark.parametrize("jitted", [False, True])
def test_kl_to_the_reference_policy(jitted):
    config = CONFIG.model_copy(update={"kl_coef": 0.5})
    reference = OFF_LOGPROBS + np.log([[1.0, 2.0, 0.5, 1.0]], dtype=np.float32)
    args = (OFF_LOGPROBS, OFF_BEHAVIOUR, OFF_ADVANTAGES, OFF_MASK, OFF_SEGMENTS)
    loss, metrics = _run(jitted, policy_loss, *args, config=config, reference_logprobs=reference)
    # exp(d) - d - 1 at d = 0, ln 2, -ln 2, 0.
    kl = [0.0, 1 - np.log(2), np.log(2) - 0.5, 0.0]
    np.testing.assert_allclose(metrics["kl_ref"], np.mean(kl), rtol=1e-5)
    without_kl, _ = policy_loss(*args, CONFIG)
    np.testing.assert_allclose(loss, without_kl + 0.5 * np.mean(kl), rtol=1e-5)
    np.testing.assert_allclose(loss, _reference_loss(*args[:4], config, reference=reference), rtol=1e-5)


def test_ppo_reference_matches_policy_loss_on_stale_tokens():
    args = (OFF_LOGPROBS, OFF_BEHAVIOUR, OFF_ADVANTAGES, OFF_MASK, OFF_SEGMENTS)
    loss, metrics = policy_loss(*args, CONFIG)
    np.testing.assert_allclose(loss, _reference_loss(*args[:4], CONFIG), rtol=1e-5)
    assert float(metrics["is_weight_mean"]) == 1.0 and float(metrics["is_capped_fraction"]) == 0.0


def test_objectives_need_their_inputs_and_ppo_has_no_weight_to_cap():
    args = (OFF_LOGPROBS, OFF_BEHAVIOUR, OFF_ADVANTAGES, OFF_MASK, OFF_SEGMENTS)
    with pytest.raises(ValueError, match="proximal_logprobs"):
        policy_loss(*args, CONFIG.model_copy(update={"objective": "decoupled-ppo"}))
    with pytest.raises(ValueError, match="reference_logprobs"):
        policy_loss(*args, CONFIG.model_copy(update={"kl_coef": 0.1}))
    with pytest.raises(ValueError, match="is_cap"):
        LossConfig(objective="ppo", is_cap=2.0)


def test_ess_fraction_is_one_on_policy_and_kish_s_formula_off_it():
    mask = np.ones((1, 4), np.float32)
    segments = np.ones((1, 4), np.int32)
    logprobs = np.log(np.array([[0.5, 0.5, 0.5, 0.5]], np.float32))
    _, on = policy_loss(logprobs, logprobs, np.zeros_like(mask), mask, segments, CONFIG)
    behaviour = np.log(np.array([[0.5, 0.25, 0.25, 1.0]], np.float32))
    _, off = policy_loss(logprobs, behaviour, np.zeros_like(mask), mask, segments, CONFIG)
    w = np.array([1.0, 2.0, 2.0, 0.5])
    np.testing.assert_allclose(float(on["ess_fraction"]), 1.0, rtol=1e-6)
    np.testing.assert_allclose(float(off["ess_fraction"]), w.mean() ** 2 / (w**2).mean(), rtol=1e-5)
