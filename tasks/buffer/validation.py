"""The entry check for malformed groups: excluded as `invalid`, never retried, never trained."""

from __future__ import annotations

import numpy as np

from learner.trajectory import Group


def invalid_reason(group: Group, *, vocab_size: int, max_len: int) -> str | None:
    """Why `group` cannot be trained on, or None if it can."""
    for i, sample in enumerate(group.samples):
        if not np.isfinite(sample.reward):
            return f"sample {i}: reward {sample.reward} is not finite"
        n = len(sample.tokens)
        if not len(sample.logprobs) == len(sample.versions) == n:
            return (f"sample {i}: {n} tokens but {len(sample.logprobs)} log-probs "
                    f"and {len(sample.versions)} versions")
        if n > max_len:
            return f"sample {i}: {n} tokens, longer than the context (model.max_len={max_len})"
        if n and (sample.tokens.min() < 0 or sample.tokens.max() >= vocab_size):
            return f"sample {i}: token outside the vocabulary of {vocab_size}"
        if not np.all(np.isfinite(sample.logprobs)):
            return f"sample {i}: log-probs are not finite"
    if not group.samples:
        return "no samples"
    if not any(s.generated.any() for s in group.samples):
        return "no generated tokens"
    return None
