"""Results: per-tenant counters and the summary rows every run reports."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class TenantStats:
    requests: int = 0
    hits: int = 0  # served from a model already resident (and ready, in the full engine)
    loads: int = 0
    shed: int = 0
    bytes_requested: int = 0  # model bytes per request
    bytes_missed: int = 0  # model bytes of requests that were not hits
    load_s: float = 0.0
    latencies: list[float] = field(default_factory=list)  # seconds, served requests (full engine only)

    def merge(self, other: TenantStats) -> None:
        self.requests += other.requests
        self.hits += other.hits
        self.loads += other.loads
        self.shed += other.shed
        self.bytes_requested += other.bytes_requested
        self.bytes_missed += other.bytes_missed
        self.load_s += other.load_s
        self.latencies.extend(other.latencies)

    def row(self) -> dict[str, float]:
        n = max(self.requests, 1)
        lat = np.asarray(self.latencies) if self.latencies else None
        return {
            "requests": self.requests,
            "hit_rate": self.hits / n,
            "byte_miss_rate": self.bytes_missed / max(self.bytes_requested, 1),
            "loads": self.loads,
            "load_s": self.load_s,
            "p50_ms": float(np.percentile(lat, 50) * 1e3) if lat is not None else float("nan"),
            "p99_ms": float(np.percentile(lat, 99) * 1e3) if lat is not None else float("nan"),
            "shed_rate": self.shed / n,
        }


@dataclass
class SimResult:
    policy: str
    cache_bytes: int
    tenants: dict[str, TenantStats]
    shed_reasons: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> TenantStats:
        t = TenantStats()
        for s in self.tenants.values():
            t.merge(s)
        return t

    def row(self) -> dict[str, float]:
        return {"policy": self.policy, "cache_bytes": self.cache_bytes, **self.total.row()}

    def tenant_rows(self) -> list[dict[str, float]]:
        return [{"policy": self.policy, "tenant": t, **s.row()} for t, s in sorted(self.tenants.items())]
