"""Entry filters: a group a filter rejects never enters the buffer (and is never retried).

A filter is `f(group) -> bool` (True keeps the group), a built-in name or "module:function".
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from learner.trajectory import Group
from tasks.entrypoints import load

Filter = Callable[[Group], bool]


def zero_variance(group: Group) -> bool:
    """Rejects a group whose rewards are all equal: its group-relative advantages are all 0."""
    rewards = group.rewards
    return bool(np.ptp(rewards) > 0)


BUILTIN: dict[str, Filter] = {"zero_variance": zero_variance}


def resolve_filter(name: str) -> Filter:
    """The filter a spec names: a built-in name or "module:function"."""
    return load(name, BUILTIN, "filter")
