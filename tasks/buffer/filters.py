"""Entry filters: a group a filter rejects never enters the buffer (and is never retried).

A filter is `f(group) -> bool` (True keeps the group), a built-in name or "module:function".
"""

from __future__ import annotations

import importlib
from typing import Callable

import numpy as np

from learner.trajectory import Group

Filter = Callable[[Group], bool]


def zero_variance(group: Group) -> bool:
    """Rejects a group whose rewards are all equal: its group-relative advantages are all 0."""
    rewards = group.rewards
    return bool(np.ptp(rewards) > 0)


BUILTIN: dict[str, Filter] = {"zero_variance": zero_variance}


def resolve_filter(name: str) -> Filter:
    if name in BUILTIN:
        return BUILTIN[name]
    module_name, sep, attr = name.partition(":")
    if not sep:
        raise ValueError(f"unknown filter {name!r}: use a built-in ({', '.join(BUILTIN)}) or \"module:function\"")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"cannot load filter {name!r}: {e}") from None
