"""The slower cache tiers below device memory: host RAM (model bytes, so a reload costs a memory copy and a
session build, not a download) and local disk (verified files). Each has a byte budget, hit and miss
counters, and LRU eviction. Thread-safe: loads run in worker threads."""

from __future__ import annotations

import logging
import shutil
import threading
from collections import OrderedDict
from collections.abc import Hashable
from pathlib import Path

from hostd.core.lru import ByteLRU

log = logging.getLogger(__name__)


class RamTier:
    """Model file bytes in host memory, LRU within a byte budget (the core's ByteLRU keeps the order and
    the byte count; this class keeps the bytes and the lock). A version larger than the budget is not kept."""

    def __init__(self, budget: int) -> None:
        self._lru = ByteLRU(budget)
        self.hits = 0
        self.misses = 0
        self._items: dict[Hashable, dict[str, bytes]] = {}
        self._lock = threading.Lock()

    @property
    def budget(self) -> int:
        return self._lru.budget

    @property
    def used(self) -> int:
        return self._lru.used

    @property
    def evictions(self) -> int:
        return self._lru.evictions

    def get(self, key: Hashable) -> dict[str, bytes] | None:
        with self._lock:
            if not self._lru.touch(key):
                self.misses += 1
                return None
            self.hits += 1
            return self._items[key]

    def put(self, key: Hashable, blobs: dict[str, bytes]) -> list[Hashable]:
        size = sum(len(b) for b in blobs.values())
        with self._lock:
            if size > self._lru.budget:
                return []
            evicted = self._lru.put(key, size)
            for k in evicted:
                del self._items[k]
            self._items[key] = blobs
        return evicted

    def discard(self, key: Hashable) -> None:
        with self._lock:
            if self._lru.discard(key) is not None:
                del self._items[key]

    def __contains__(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._lru


class DiskTier:
    """Verified model files under `root/<tenant>/<model>/<version>/`, LRU within a byte budget. Versions
    found on disk at start are adopted (they carry their verification markers)."""

    def __init__(self, root: Path, budget: int) -> None:
        self.root = Path(root)
        self.budget = budget
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self._sizes: OrderedDict[tuple[str, str, str], int] = OrderedDict()
        self._pinned: dict[tuple[str, str, str], int] = {}
        self._lock = threading.Lock()
        self._scan()

    @property
    def used(self) -> int:
        with self._lock:
            return sum(self._sizes.values())

    def _scan(self) -> None:
        if not self.root.is_dir():
            return
        found = []
        for d in self.root.glob("*/*/*"):
            if d.is_dir():
                size = sum(f.stat().st_size for f in d.rglob("*") if f.is_file() and not f.name.startswith(".part-"))
                found.append((d.stat().st_mtime, (d.parts[-3], d.parts[-2], d.parts[-1]), size))
        for _, key, size in sorted(found):
            self._sizes[key] = size

    def path(self, key: tuple[str, str, str]) -> Path:
        return self.root.joinpath(*key)

    def lookup(self, key: tuple[str, str, str]) -> bool:
        """Count a hit (and refresh recency) or a miss."""
        with self._lock:
            if key in self._sizes:
                self._sizes.move_to_end(key)
                self.hits += 1
                return True
            self.misses += 1
            return False

    def hold(self, key: tuple[str, str, str]) -> None:
        """Protect a version from eviction while it is being written or read."""
        with self._lock:
            self._pinned[key] = self._pinned.get(key, 0) + 1

    def release(self, key: tuple[str, str, str]) -> None:
        with self._lock:
            n = self._pinned.get(key, 0) - 1
            if n <= 0:
                self._pinned.pop(key, None)
            else:
                self._pinned[key] = n

    def make_room(self, incoming: int) -> list[tuple[str, str, str]]:
        """Evict least recently used versions (not held) until `incoming` more bytes fit."""
        evicted = []
        with self._lock:
            used = sum(self._sizes.values())
            for key in list(self._sizes):
                if used + incoming <= self.budget:
                    break
                if key in self._pinned:
                    continue
                used -= self._sizes.pop(key)
                evicted.append(key)
                self.evictions += 1
        for key in evicted:
            shutil.rmtree(self.path(key), ignore_errors=True)
        if evicted:
            log.info("disk tier evicted %d version(s)", len(evicted))
        return evicted

    def added(self, key: tuple[str, str, str], size: int) -> None:
        with self._lock:
            self._sizes[key] = size
            self._sizes.move_to_end(key)

    def grow(self, key: tuple[str, str, str], n: int) -> None:
        """Files added to (n < 0: removed from) a version already counted, such as its saved graphs."""
        with self._lock:
            if key in self._sizes:
                self._sizes[key] = max(0, self._sizes[key] + n)

    def forget(self, key: tuple[str, str, str]) -> None:
        with self._lock:
            self._sizes.pop(key, None)
        shutil.rmtree(self.path(key), ignore_errors=True)
