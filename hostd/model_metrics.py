"""The model manager's Prometheus updates in one place: loads and their phases, tier hits and misses, bytes
per tier and per tenant, resident models, evictions and refused loads."""

from __future__ import annotations

from ground.manifest import ModelManifest
from hostd.core.device import DeviceCache
from hostd.loader import Loader, LoadResult
from hostd.metrics import HostdMetrics


class ModelMetrics:
    def __init__(self, metrics: HostdMetrics, cache: DeviceCache, loader: Loader) -> None:
        self.m = metrics
        self.cache = cache
        self.loader = loader
        # every request's device lookup: its two series bound once (labels() per call cost ~8 us a request)
        self._device_hit = metrics.cache.hits.labels("device")
        self._device_miss = metrics.cache.misses.labels("device")

    def device_lookup(self, hit: bool) -> None:
        (self._device_hit if hit else self._device_miss).inc()

    def tiers(self) -> None:
        c = self.m.cache
        c.bytes.labels("device").set(self.cache.used)
        c.bytes.labels("disk").set(self.loader.disk.used)
        if self.loader.ram is not None:
            c.bytes.labels("ram").set(self.loader.ram.used)
        for tenant, n in self.cache.tenant_bytes().items():
            c.tenant_bytes.labels(tenant).set(n)

    def source_tier(self, source: str) -> None:
        """Where a load's bytes came from: a hit or miss in the RAM tier, then in the disk tier."""
        c = self.m.cache
        if self.loader.ram is not None:
            (c.hits if source == "ram" else c.misses).labels("ram").inc()
        if source != "ram":
            (c.hits if source == "disk" else c.misses).labels("disk").inc()

    def loaded(self, m: ModelManifest, res: LoadResult, memory_bytes: int) -> None:
        for phase, secs in res.timings.items():
            self.m.load_duration.labels(phase).observe(secs)
        self.source_tier(res.source_tier)
        if res.saved_graph is not None:  # the disk tier's graph cache (runtimes that save graphs)
            (self.m.cache.hits if res.saved_graph else self.m.cache.misses).labels("graph").inc()
        self.m.loads.labels(m.tenant, m.model, "success").inc()
        self.m.model_memory.labels(m.tenant, m.model, m.version).set(memory_bytes)

    def load_path(self, stages: dict[str, float]) -> None:
        for stage, secs in stages.items():
            self.m.load_path.labels(stage).observe(secs)

    def failed(self, m: ModelManifest) -> None:
        self.m.loads.labels(m.tenant, m.model, "failure").inc()

    def refused(self, m: ModelManifest) -> None:
        self.m.cache.load_refused.labels(m.tenant, m.model).inc()

    def evicted(self, reason: str) -> None:
        self.m.cache.evictions.labels("device", reason).inc()

    def unloaded(self, m: ModelManifest, had_memory: bool) -> None:
        if had_memory:
            self.m.model_memory.remove(m.tenant, m.model, m.version)

    def resident(self, n: int) -> None:
        self.m.models_resident.set(n)
