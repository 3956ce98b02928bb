"""Which free slots of `learner.engine` still hold a finished request's prefix (warm), for
the next request of the same sequence, and which to evict when a slot is needed.

Host-side bookkeeping only: a dict from prefix key to slot in least-recently-used order,
and what each warm slot's cache holds (its tokens and the weights version that computed
them), so a match costs one dict look-up and one comparison of at most max_len tokens.
"""

from __future__ import annotations

import collections
from collections.abc import Hashable, Iterator

import numpy as np


class WarmSlots:
    """Free slots whose cache still holds a finished request's prefix, by prefix key,
    least recently used first. Every other free slot is cold."""

    def __init__(self, slots: int):
        self._lru: collections.OrderedDict[Hashable, int] = collections.OrderedDict()
        self._held: list[tuple[np.ndarray, int] | None] = [None] * slots  # (tokens cached, version)

    def __len__(self) -> int:
        return len(self._lru)

    def keep(self, slot: int, key: Hashable, tokens: np.ndarray, version: int) -> None:
        """Makes `slot` warm, the most recent, holding `tokens` computed by `version`
        (an older slot of `key` turns cold)."""
        self.drop(key)
        self._held[slot] = (tokens, version)
        self._lru[key] = slot

    def drop(self, key: Hashable) -> None:
        """The slot of `key`, if warm, turns cold."""
        slot = self._lru.pop(key, None)
        if slot is not None:
            self._held[slot] = None

    def claim(self, key: Hashable | None, tokens: np.ndarray, version: int) -> tuple[int, int] | None:
        """(the warm slot of `key`, the position from which `tokens` need a prefill) if that
        slot holds a prefix of `tokens` computed by `version`, else None. Either way the
        slot is no longer warm: claimed, or useless to `key` from now on."""
        slot = self._lru.pop(key, None) if key is not None else None
        if slot is None:
            return None
        (held, held_version), self._held[slot] = self._held[slot], None
        if held_version != version or len(held) > len(tokens) or not (tokens[: len(held)] == held).all():
            return None
        return slot, min(len(held), len(tokens) - 1)  # at least the last token runs: its logits

    def spare(self, free: np.ndarray, claimed: set[int]) -> Iterator[int]:
        """Free slots for whole-context prefills: the cold ones in `free` but `claimed`, then
        the warm ones, least recently used first, each evicted as it is taken."""
        yield from (b for b in free if self._held[b] is None and b not in claimed)
        while self._lru:
            _, slot = self._lru.popitem(last=False)
            self._held[slot] = None
            yield slot
