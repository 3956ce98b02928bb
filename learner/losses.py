"""Group-relative advantages, the token-level clipped policy objectives, and the
supervised objective of a warm-up.

Pure functions over [R, L] arrays laid out as `learner.batching.Batch` lays them
out: R packed rows of L tokens, `segment_ids` telling the sequences of a row apart.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from learner.config import LossConfig

# Mesh axes a reduction runs over inside `jax.shard_map`; None outside it.
AxisName = str | tuple[str, ...] | None


def _check_same_shape(ndim: int, **arrays) -> None:
    shapes = {name: tuple(x.shape) for name, x in arrays.items()}
    first = next(iter(shapes.values()))
    if len(first) != ndim or any(s != first for s in shapes.values()):
        raise ValueError(f"expected arrays of one shape with {ndim} dims, got {shapes}")


def group_advantages(rewards, *, normalize_std: bool, eps: float = 1e-6):
    """Advantages relative to the other samples of the same prompt (GRPO; Dr. GRPO).

    References: Shao et al. 2024 (DeepSeekMath, GRPO); Liu et al. 2025 (Dr. GRPO,
    which drops the division by the standard deviation).

    Args:
      rewards: [N, G] returns of G samples for each of N prompts; a NumPy or JAX
        array, and the result is of the same kind (NumPy off the accelerator).
      normalize_std: divide by the group's (population) standard deviation.
      eps: added to the standard deviation, so equal rewards give zero advantage.

    Returns:
      [N, G] advantages: r - mean_g(r), divided by std_g(r) + eps if normalize_std.
    """
    if rewards.ndim != 2:
        raise ValueError(f"rewards must be [groups, group_size], got shape {tuple(rewards.shape)}")
    centred = rewards - rewards.mean(axis=1, keepdims=True)
    if not normalize_std:
        return centred
    return centred / (rewards.std(axis=1, keepdims=True) + eps)


def token_logprobs(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """float32 [B, L] log-softmax of `logits` [B, L, V] at the int `targets` [B, L]."""
    if logits.shape[:-1] != targets.shape:
        raise ValueError(f"logits {logits.shape} do not match targets {targets.shape}")
    return _picked_log_softmax(logits, targets)


# The gradient written out, one elementwise pass over the logits: g (onehot - softmax).
# Differentiated automatically, the pick's transpose scatters into a zeroed [B, L, V]
# and the log-softmax's adds a pass over it: on a 2 x 1,024-token batch over a 32,768-id
# vocabulary the loss's head took 3.1 s forward and backward that way, 2.5 s this way
# (BENCHMARKS.md (t)).
@jax.custom_vjp
def _picked_log_softmax(logits: jax.Array, targets: jax.Array) -> jax.Array:
    return _picked_log_softmax_fwd(logits, targets)[0]


def _picked_log_softmax_fwd(logits, targets):
    logits32 = logits.astype(jnp.float32)
    log_normalizer = jax.nn.logsumexp(logits32, axis=-1)
    picked = jnp.take_along_axis(logits32, targets[..., None], axis=-1)[..., 0]
    return picked - log_normalizer, (logits, targets, log_normalizer)


def _picked_log_softmax_bwd(residuals, g):
    logits, targets, log_normalizer = residuals
    onehot = jnp.arange(logits.shape[-1]) == targets[..., None]
    softmax = jnp.exp(logits.astype(jnp.float32) - log_normalizer[..., None])
    return (g[..., None] * (onehot - softmax)).astype(logits.dtype), None


_picked_log_softmax.defvjp(_picked_log_softmax_fwd, _picked_log_softmax_bwd)


def token_entropy(logits: jax.Array) -> jax.Array:
    """float32 [B, L] entropy of the next-token distribution given by `logits` [B, L, V]."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -jnp.sum(jnp.exp(logp) * logp, axis=-1)


def _psum(x: jax.Array, axis_name: AxisName) -> jax.Array:
    return x if axis_name is None else jax.lax.psum(x, axis_name)


def masked_mean(x: jax.Array, mask: jax.Array, axis_name: AxisName = None) -> jax.Array:
    """Mean of `x` where `mask` is 1; 0 when the mask is empty.

    With `axis_name` (inside `jax.shard_map`), over the tokens of every device of
    those mesh axes: the result is the same on all of them.
    """
    return _psum(jnp.sum(x * mask), axis_name) / jnp.maximum(_psum(jnp.sum(mask), axis_name), 1.0)


def _sequence_sums(x: jax.Array, mask: jax.Array, segment_ids: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(sum of per-sequence means, number of sequences with any masked token).

    A sequence is a (row, segment id) pair; its id in a flat segment sum is
    row * (L + 1) + segment id, which needs no bound on the sequences per row.
    """
    rows, length = segment_ids.shape
    ids = (jnp.arange(rows)[:, None] * (length + 1) + segment_ids).reshape(-1)
    n = rows * (length + 1)
    sums = jax.ops.segment_sum((x * mask).reshape(-1), ids, num_segments=n)
    counts = jax.ops.segment_sum(mask.reshape(-1), ids, num_segments=n)
    has_tokens = (counts > 0).astype(x.dtype)
    return jnp.sum(sums / jnp.maximum(counts, 1.0) * has_tokens), jnp.sum(has_tokens)


def sequence_mean(x: jax.Array, mask: jax.Array, segment_ids: jax.Array) -> jax.Array:
    """Mean over the masked tokens of each sequence, then over sequences with any."""
    total, sequences = _sequence_sums(x, mask, segment_ids)
    return total / jnp.maximum(sequences, 1.0)


def aggregate_share(
    x: jax.Array, mask: jax.Array, segment_ids: jax.Array, aggregation: str, axis_name: AxisName = None
) -> jax.Array:
    """This device's share of the token- or sequence-mean of `x` over all devices.

    The numerator is local and the denominator (tokens or sequences) global, so
    the shares of the devices of `axis_name` sum to the mean over all of them and
    the gradient of a share is this device's part of the gradient of the mean.
    Without `axis_name` it is the mean itself.
    """
    if aggregation == "token-mean":
        total, count = jnp.sum(x * mask), jnp.sum(mask)
    elif aggregation == "sequence-mean":
        total, count = _sequence_sums(x, mask, segment_ids)
    else:
        raise ValueError(f"aggregation must be 'token-mean' or 'sequence-mean', got {aggregation!r}")
    return total / jnp.maximum(_psum(jax.lax.stop_gradient(count), axis_name), 1.0)


def importance_weights(
    anchor_logprobs: jax.Array, behaviour_logprobs: jax.Array, is_cap: float | None
) -> jax.Array:
    """min(pi_anchor / mu, is_cap), without gradient: the truncated IS weight of each token.

    Reference: Espeholt et al. 2018 (IMPALA's truncated rho); Yao et al. 2025
    (truncated importance sampling against a stale or mismatched sampler).
    """
    weights = jnp.exp(jax.lax.stop_gradient(anchor_logprobs) - behaviour_logprobs)
    return weights if is_cap is None else jnp.minimum(weights, is_cap)


def reference_kl(logprobs: jax.Array, reference_logprobs: jax.Array) -> jax.Array:
    """[R, L] per-token KL(pi || pi_ref) estimate exp(d) - d - 1, d = log pi_ref - log pi.

    Reference: Schulman 2020, "Approximating KL divergence" (k3; unbiased, >= 0),
    as in GRPO.
    """
    d = reference_logprobs - logprobs
    return jnp.exp(d) - d - 1.0


def _anchor(logprobs, behaviour_logprobs, proximal_logprobs, objective: str) -> jax.Array:
    """The log-probs the clip is centred on, by `LossConfig.objective`."""
    if objective == "ppo":
        return behaviour_logprobs
    if objective == "tis":
        return jax.lax.stop_gradient(logprobs)
    if proximal_logprobs is None:
        raise ValueError("objective 'decoupled-ppo' needs proximal_logprobs")
    return proximal_logprobs


def policy_loss(
    logprobs: jax.Array,
    behaviour_logprobs: jax.Array,
    advantages: jax.Array,
    loss_mask: jax.Array,
    segment_ids: jax.Array,
    config: LossConfig,
    *,
    proximal_logprobs: jax.Array | None = None,
    reference_logprobs: jax.Array | None = None,
    axis_name: AxisName = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Token-level clipped surrogate with truncated importance weights and a KL penalty.

    Per token, with ratio r = pi / pi_anchor and weight w = min(pi_anchor / mu, is_cap):
      objective = w * min(r * A, clip(r, 1 - clip_low, 1 + clip_high) * A),
    where pi_anchor is mu (the behaviour policy) for "ppo", pi itself without
    gradient for "tis" (so r = 1 and the gradient is w * A * grad log pi), and the
    proximal policy for "decoupled-ppo". loss = -aggregate(objective) +
    kl_coef * aggregate(KL(pi || pi_ref)).

    References: Schulman et al. 2017 (PPO); Yu et al. 2025 (DAPO: token-mean and
    separate clip_low / clip_high); Hilton et al. 2022 (decoupled PPO, as in
    AReaL, Fu et al. 2025); Shao et al. 2024 (GRPO's KL to a reference).

    Args:
      logprobs: [R, L] log-probs of the targets under the policy being trained.
      behaviour_logprobs: [R, L] log-probs recorded by the actors that sampled them.
      advantages: [R, L] advantage of each token's sequence.
      loss_mask: [R, L] 1 on the tokens to train (generated by the policy), else 0.
      segment_ids: int [R, L] sequence of each token within its row, 0 = padding.
      config: objective, clipping range, is_cap, kl_coef and aggregation.
      proximal_logprobs: [R, L] log-probs under the proximal policy ("decoupled-ppo").
      reference_logprobs: [R, L] log-probs under the reference policy (kl_coef > 0).
      axis_name: mesh axes the batch's rows are split over, inside `jax.shard_map`.

    Returns:
      (loss, metrics): the scalar loss (with `axis_name`, this device's share of
      it: see `aggregate_share`) and scalar metrics over the masked tokens of all
      devices: clip_fraction, ratio_mean, ratio_max (of r), is_weight_mean,
      is_capped_fraction, approx_kl (mu to pi), kl_ref, advantage_mean and ess_fraction
      (the effective sample size of the weights pi / mu over the tokens, as a fraction).
    """
    _check_same_shape(
        2,
        logprobs=logprobs,
        behaviour_logprobs=behaviour_logprobs,
        advantages=advantages,
        loss_mask=loss_mask,
        segment_ids=segment_ids,
    )
    if config.kl_coef > 0 and reference_logprobs is None:
        raise ValueError("kl_coef > 0 needs reference_logprobs")
    mask = loss_mask.astype(jnp.float32)
    anchor = _anchor(logprobs, behaviour_logprobs, proximal_logprobs, config.objective)
    weights = importance_weights(anchor, behaviour_logprobs, config.is_cap)
    ratio = jnp.exp(logprobs - anchor)
    unclipped = ratio * advantages
    clipped = jnp.clip(ratio, 1.0 - config.clip_low, 1.0 + config.clip_high) * advantages
    objective = weights * jnp.minimum(unclipped, clipped)
    loss = -aggregate_share(objective, mask, segment_ids, config.aggregation, axis_name)
    kl = jnp.zeros_like(logprobs) if reference_logprobs is None else reference_kl(logprobs, reference_logprobs)
    if config.kl_coef > 0:
        loss += config.kl_coef * aggregate_share(kl, mask, segment_ids, config.aggregation, axis_name)
    stats = jax.lax.stop_gradient((ratio, unclipped, clipped, weights, kl, logprobs))
    metrics = _metrics(*stats, anchor, behaviour_logprobs, advantages, mask, axis_name)
    return loss, metrics


def supervised_loss(
    logprobs: jax.Array, loss_mask: jax.Array, segment_ids: jax.Array, aggregation: str, *,
    axis_name: AxisName = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Negative log-likelihood of the masked tokens: supervised fine-tuning on
    demonstrations, trained on the agent's tokens only (the environment's are context).

    Returns:
      (loss, metrics): the scalar loss (with `axis_name`, this device's share, as in
      `aggregate_share`) and `nll`, the token mean over all devices.
    """
    _check_same_shape(2, logprobs=logprobs, loss_mask=loss_mask, segment_ids=segment_ids)
    mask = loss_mask.astype(jnp.float32)
    loss = -aggregate_share(logprobs, mask, segment_ids, aggregation, axis_name)
    return loss, {"nll": -masked_mean(jax.lax.stop_gradient(logprobs), mask, axis_name)}


def _metrics(ratio, unclipped, clipped, weights, kl, logprobs, anchor, behaviour, advantages, mask, axis_name):
    """The scalar metrics `policy_loss` reports (inputs without gradient)."""
    uncapped = jnp.exp(jax.lax.stop_gradient(anchor) - behaviour)
    # Kish's effective sample size of the tokens' weights pi / mu, as a fraction of the tokens:
    # 1 on-policy, smaller as the actors' policy drifts from the one trained.
    behaviour_weights = jnp.exp(logprobs - behaviour)
    ess = masked_mean(behaviour_weights, mask, axis_name) ** 2 / jnp.maximum(
        masked_mean(behaviour_weights**2, mask, axis_name), 1e-30)  # no tokens: 0
    return {
        "clip_fraction": masked_mean((clipped < unclipped).astype(jnp.float32), mask, axis_name),
        "ratio_mean": masked_mean(ratio, mask, axis_name),
        "ratio_max": _pmax(jnp.max(jnp.where(mask > 0, ratio, 0.0)), axis_name),
        "is_weight_mean": masked_mean(weights, mask, axis_name),
        "is_capped_fraction": masked_mean((weights < uncapped).astype(jnp.float32), mask, axis_name),
        "approx_kl": masked_mean(behaviour - logprobs, mask, axis_name),
        "kl_ref": masked_mean(kl, mask, axis_name),
        "advantage_mean": masked_mean(advantages, mask, axis_name),
        "ess_fraction": ess,
    }


def _pmax(x: jax.Array, axis_name: AxisName) -> jax.Array:
    return x if axis_name is None else jax.lax.pmax(x, axis_name)
