"""Where a model's bytes are when it is not on the device: host RAM (bounded, LRU: the host core's ByteLRU,
the same bookkeeping as hostd's RAM tier), else local disk once it was ever loaded, else object storage.
An evicted model drops to host RAM."""

from __future__ import annotations

from collections.abc import Hashable

from hostd.core.lru import ByteLRU


class Tiers:
    def __init__(self, host_ram_bytes: int = 0) -> None:
        self.host_ram_bytes = host_ram_bytes
        self.ram = ByteLRU(host_ram_bytes)
        self._disk: set[Hashable] = set()

    @property
    def reload_tier(self) -> str:
        """The tier an evicted model is expected to come back from."""
        return "host_ram" if self.host_ram_bytes > 0 else "disk"

    def tier_of(self, key: Hashable) -> str:
        if key in self.ram:
            return "host_ram"
        return "disk" if key in self._disk else "storage"

    def on_load(self, key: Hashable) -> None:
        self._disk.add(key)
        self.ram.discard(key)

    def on_evict(self, key: Hashable, size: int) -> None:
        self.ram.put(key, size)
