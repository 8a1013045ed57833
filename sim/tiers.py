"""Where a model's bytes are when it is not on the device: host RAM (bounded, LRU), else local disk once
it was ever loaded, else object storage. An evicted model drops to host RAM."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable


class Tiers:
    def __init__(self, host_ram_bytes: int = 0) -> None:
        self.host_ram_bytes = host_ram_bytes
        self._ram: OrderedDict[Hashable, int] = OrderedDict()
        self._ram_used = 0
        self._disk: set[Hashable] = set()

    @property
    def reload_tier(self) -> str:
        """The tier an evicted model is expected to come back from."""
        return "host_ram" if self.host_ram_bytes > 0 else "disk"

    def tier_of(self, key: Hashable) -> str:
        if key in self._ram:
            return "host_ram"
        return "disk" if key in self._disk else "storage"

    def on_load(self, key: Hashable) -> None:
        self._disk.add(key)
        size = self._ram.pop(key, None)
        if size is not None:
            self._ram_used -= size

    def on_evict(self, key: Hashable, size: int) -> None:
        if size > self.host_ram_bytes:
            return
        ram = self._ram
        ram[key] = size
        self._ram_used += size
        while self._ram_used > self.host_ram_bytes:
            _, s = ram.popitem(last=False)
            self._ram_used -= s
