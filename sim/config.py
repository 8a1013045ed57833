"""A simulation described in one file (YAML or JSON) or by flags; flags override the file.

Example (YAML):
    workload: {models: 1000, requests: 200000, zipf: 0.9, tenants: 4, noisy_models: 2000, noisy_share: 0.3}
    cache_fraction: 0.1          # or cache_bytes: 8000000000
    policies: [lru, gdsf, offline]
    shares: {t0: {guaranteed: 1000000000}, noisy: {maximum: 2000000000}}
    costs: {load_fixed_s: 0.1, load_s_per_byte: {storage: 5.0e-9}}   # sim.costs.calibrate input
    mode: full                   # cache (fast path, default) or full (batching, latency)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from hostd.batch_policy import BatchConfig
from hostd.cache.policy import POLICIES, Share
from sim.cluster import ClusterConfig
from sim.costs import CostModel, calibrate
from sim.trace import TraceReport, read_trace_report
from sim.workload import SyntheticConfig, Workload, generate


class ShareConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    guaranteed: int = Field(0, ge=0)
    maximum: int | None = Field(None, ge=0)


class SimConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    workload: SyntheticConfig = SyntheticConfig()
    trace: list[Path] | None = Field(None, description="replay these access logs (JSON lines) instead of "
                                     "synthesizing, merged in time order: a fleet's routers and their Python-lane "
                                     "workers' (FILE.wN) each write one")
    sizes_from: str | None = Field(None, description="trace: model sizes from this model store's manifests "
                                   "(folder, file:// or s3://) instead of the trace's size_bytes")
    mode: Literal["cache", "full"] = "cache"
    cache_fraction: float = Field(0.1, gt=0, description="cache size as a share of all model bytes")
    cache_bytes: int | None = Field(None, gt=0, description="cache size in bytes (per host); wins over fraction")
    policies: list[str] = ["lru", "gdsf", "offline"]
    sizes: list[float] = [0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75]
    high: float = Field(1.0, gt=0, le=1, description="high watermark, share of the cache")
    low: float = Field(1.0, gt=0, le=1, description="low watermark, share of the cache")
    host_ram_bytes: int = Field(0, ge=0, description="host RAM tier per host; 0: reloads come from disk")
    shares: dict[str, ShareConfig] = {}
    pinned: list[str] = []
    costs: dict[str, Any] = {}
    hosts: int = Field(1, ge=1)
    max_batch_size: int = Field(32, ge=0)
    max_queue_delay_s: float = Field(0.0, ge=0)
    executors_per_model: int = Field(1, ge=1)
    slots: int = Field(0, ge=0, description="host-wide execution slots (batches at once, fair across tenants); "
                       "0: no host-wide limit")
    per_model_slots: int = Field(0, ge=0, description="slots one model may hold (hostd's "
                                 "execution_slots_per_model); 0: all but one")
    fair_unit: Literal["tenant", "model"] = Field("model", description="hostd's fair_unit")
    cores: int = Field(0, ge=0, description="CPU cores per host for the contention model (batches slow down when "
                       "running batches x threads exceed them); 0: off")
    threads: int = Field(1, ge=1, description="intra-op threads per running batch (hostd's ort_intra_op_threads)")
    load_workers: int = Field(0, ge=0, description="hostd's load threads (4): loads queue for them, deserialize one "
                              "at a time, evictions close through them; 0: one load at a time, instant evictions")
    attempts: int = Field(1, ge=1, description="hosts tried per request when one has no room or a full queue "
                          "(the router's max_attempts, 3)")
    size_spread: list[tuple[float, float]] = Field(
        [], description="full mode: [[measured / model size, cumulative probability], ...]: each load draws its "
        "measured size (sim/calibrate.py, from hostd's per-load readings); empty: sizes as given")
    max_queue: int = Field(1024, ge=1)
    deadline_s: float | None = Field(None, gt=0)
    host_groups: list[str] = Field([], description="full mode: the host group of each host by index (hostd's "
                                   "host_group; missing = the shared pool '')")
    groups: dict[str, str] = Field({}, description="full mode: the router's host_groups ({tenant or tenant/model: "
                                   "group}); with either set, the router's own placement places the requests")

    @model_validator(mode="after")
    def _check(self) -> SimConfig:
        for p in self.policies:
            if p != "offline" and p not in POLICIES:
                raise ValueError(f"unknown policy {p!r}; known: {', '.join([*POLICIES, 'offline'])}")
        if self.low > self.high:
            raise ValueError("low watermark must not exceed high")
        if len(self.host_groups) > self.hosts:
            raise ValueError(f"host_groups names {len(self.host_groups)} hosts of {self.hosts}")
        have = {*self.host_groups, *([""] if len(self.host_groups) < self.hosts else [])}
        if missing := sorted({g for g in self.groups.values() if g not in have} | ({""} - have if self.groups or
                                                                                    self.host_groups else set())):
            raise ValueError(f"no host in group(s) {', '.join(repr(g) for g in missing)} ('' = the shared pool)")
        return self

    def placement(self):
        """The placement hook of full mode: the router's own (sim/placement.py) with host groups, else None
        (the engine's default: the host with the most free bytes)."""
        if not self.groups and not self.host_groups:
            return None
        from router.placement_policy import PlacementConfig
        from sim.placement import RouterPlacement

        return RouterPlacement(PlacementConfig(), seed=self.workload.seed, groups=self.groups,
                               host_groups=self.host_groups)

    def share_map(self) -> dict[str, Share] | None:
        return {t: Share(s.guaranteed, s.maximum) for t, s in self.shares.items()} or None

    def cost_model(self) -> CostModel:
        return calibrate(self.costs) if self.costs else CostModel()

    @field_validator("trace", mode="before")
    @classmethod
    def _one_or_more(cls, v):
        """A config file may name one log or a list; none (an empty list) means a synthetic workload."""
        if v is None:
            return None
        if isinstance(v, (list, tuple)):
            return list(v) or None
        return [v]

    def load_workload(self) -> Workload:
        return self.load_workload_report()[0]

    def load_workload_report(self) -> tuple[Workload, TraceReport | None]:
        """The workload, and for a trace what reading it skipped (sim/trace.py)."""
        if not self.trace:
            return generate(self.workload), None
        sizes_for = None
        if self.sizes_from:
            from sim.store_sizes import store_sizes

            uri = self.sizes_from
            sizes_for = lambda keys: store_sizes(uri, keys)  # noqa: E731
        return read_trace_report(self.trace, sizes_for=sizes_for)

    def cache_size(self, wl: Workload) -> int:
        return self.cache_bytes or int(wl.total_bytes * self.cache_fraction)

    def cache_kwargs(self) -> dict[str, Any]:
        return {"shares": self.share_map(), "high": self.high, "low": self.low,
                "host_ram_bytes": self.host_ram_bytes, "pinned": tuple(self.pinned)}

    def cluster(self, policy: str, cache_bytes: int) -> ClusterConfig:
        return ClusterConfig(
            hosts=self.hosts, device_bytes=cache_bytes, policy=policy, high=self.high, low=self.low,
            shares=self.share_map(), pinned=tuple(self.pinned),
            batch=BatchConfig(max_batch_size=self.max_batch_size, max_queue_delay=self.max_queue_delay_s),
            executors_per_model=self.executors_per_model, slots=self.slots, max_queue=self.max_queue,
            per_model_slots=self.per_model_slots, fair_unit=self.fair_unit, cores=self.cores, threads=self.threads,
            deadline_s=self.deadline_s or float("inf"), host_ram_bytes=self.host_ram_bytes,
            load_workers=self.load_workers, attempts=self.attempts,
            size_spread=tuple((float(x), float(p)) for x, p in self.size_spread),
        )


def load_config(path: str | Path | None, overrides: dict[str, Any] | None = None) -> SimConfig:
    """Read the file (YAML or JSON), then apply `overrides` (None values ignored; key "workload" merges)."""
    data: dict[str, Any] = {}
    if path is not None:
        text = Path(path).read_text(encoding="utf-8")
        data = json.loads(text) if str(path).endswith(".json") else (yaml.safe_load(text) or {})
    for k, v in (overrides or {}).items():
        if k == "workload":
            data["workload"] = {**data.get("workload", {}), **{a: b for a, b in v.items() if b is not None}}
        elif v is not None:
            data[k] = v
    return SimConfig.model_validate(data)
