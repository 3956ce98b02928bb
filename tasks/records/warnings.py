"""The warning levels of entropy collapse, in one place: the live line, the learner's log
line and `tandem report` mark the same crossings (README, "The two commands").

GRPO on a small model often collapses: the policy turns deterministic, every episode of a
group then gets the same reward, the entry filter `zero_variance` drops the group (its
group-relative advantages are all 0), and the learner starves. Entropy falls first; the
filtered share follows.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

# Nats per trained token (`entropy` in metrics.jsonl). At 0.1 a two-way choice puts about
# 98% on one token: the episodes of a group barely differ any more.
ENTROPY_WARN = 0.1
# Of the groups that finished, the share an entry filter dropped (`filtered_share`): from
# 0.8 on, the learner gets at most one group in five that the actors play.
FILTERED_WARN = 0.8


def entropy_collapsing(entropy: float | None) -> bool:
    """Entropy below its level: the policy is nearly deterministic."""
    return entropy is not None and not math.isnan(entropy) and entropy < ENTROPY_WARN


def filtered_too_often(share: float | None) -> bool:
    """The filtered share at its level or above: most groups carry no signal."""
    return share is not None and share >= FILTERED_WARN


CROSSED: dict[str, Callable[[float | None], bool]] = {
    "entropy": entropy_collapsing,
    "filtered_share": filtered_too_often,
}


def first_crossing(records: Sequence[dict], field: str) -> dict | None:
    """The first `metrics.jsonl` record whose `field` ("entropy" or "filtered_share") is past
    its warning level; None if none is."""
    crossed = CROSSED[field]
    return next((r for r in records if crossed(r.get(field))), None)
