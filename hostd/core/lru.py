"""A byte-bounded LRU of keys and sizes: the bookkeeping of the host RAM tier, shared by hostd's RamTier
(hostd/cache/tiers.py, which keeps the bytes themselves) and the simulator's tiers (sim/tiers.py)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable


class ByteLRU:
    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.used = 0
        self.evictions = 0
        self._sizes: OrderedDict[Hashable, int] = OrderedDict()

    def __contains__(self, key: Hashable) -> bool:
        return key in self._sizes

    def __len__(self) -> int:
        return len(self._sizes)

    def touch(self, key: Hashable) -> bool:
        """A hit makes the key the most recent; False when it is not held."""
        if key not in self._sizes:
            return False
        self._sizes.move_to_end(key)
        return True

    def put(self, key: Hashable, size: int) -> list[Hashable]:
        """Hold `key` as the most recent, evicting least recently used keys until it fits; returns them.
        A key larger than the budget is not held (and evicts nothing)."""
        if size > self.budget:
            return []
        self.discard(key)
        sizes = self._sizes
        evicted: list[Hashable] = []
        while sizes and self.used + size > self.budget:
            k, s = sizes.popitem(last=False)
            self.used -= s
            self.evictions += 1
            evicted.append(k)
        sizes[key] = size
        self.used += size
        return evicted

    def discard(self, key: Hashable) -> int | None:
        """Drop the key; returns its size, or None when it was not held."""
        s = self._sizes.pop(key, None)
        if s is not None:
            self.used -= s
        return s
