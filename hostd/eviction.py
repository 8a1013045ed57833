"""Eviction orchestration on the device: room for a load (reserve in the core's device cache, then unload
the models its plan names, or refuse the load) and watermark eviction. The decisions are the core's
(hostd/core/residency.py and device.py over hostd/cache/policy.py); this file carries them out through
`unload`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from ground.errors import Unavailable
from hostd.core.residency import Residency
from hostd.entry import Key, ModelEntry
from hostd.model_metrics import ModelMetrics

Unload = Callable[[ModelEntry, str], Awaitable[None]]  # (entry, reason)


class Evictor:
    def __init__(self, residency: Residency, entries: Mapping[Key, ModelEntry], unload: Unload,
                 metrics: ModelMetrics, clock: Callable[[], float]) -> None:
        self.residency = residency
        self.cache = residency.cache
        self._entries = entries
        self._unload = unload
        self._metrics = metrics
        self._clock = clock

    async def _evict(self, keys: tuple, reason: str) -> None:
        for key in keys:
            victim = self._entries.get(key)
            if victim is not None:
                await self._unload(victim, reason)
            else:  # counted but unknown to the manager: nothing to unload, stop counting it
                self.cache.release(key)

    async def make_room(self, e: ModelEntry) -> None:
        """Reserve device memory for a load, evicting by policy first; refuse the load (UNAVAILABLE,
        no_capacity) when nothing can be evicted (everything busy, pinned, or protected by its tenant's share)."""
        m = e.manifest
        estimate = e.last_memory_bytes or m.total_bytes
        plan = self.residency.reserve(e.key, m.tenant, estimate, self._clock())
        if not plan.ok:  # the model is ABSENT again
            self._metrics.refused(m)
            raise Unavailable(
                f"no device memory for model {m.model!r} version {m.version!r}: {plan.reason}",
                reason="no_capacity", retry_after_ms=500,
            )
        await self._evict(plan.evict, "capacity")

    async def enforce_watermark(self, measured_used: int | None = None) -> int:
        """Evict (best effort) once measured use passes the high watermark, down to the low one."""
        plan = self.cache.watermark_plan(self._clock(), measured_used)
        await self._evict(plan.evict, "watermark")
        return len(plan.evict)
