"""Workloads: models (key, tenant, size) and requests (time, model index), as numpy arrays.

Synthetic: N models with lognormal sizes, Zipf popularity (tunable exponent) under a random rank order,
Poisson or bursty arrivals, popularity drift (ranks swap every drift period), several tenants, and an
optional noisy tenant that owns many models and spreads a share of the requests evenly over them (the
scan that pollutes an unprotected cache). Same config and seed, same workload.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field


@dataclass(frozen=True, slots=True)
class ModelSpec:
    key: str  # "tenant/model/version"
    tenant: str
    size: int  # bytes on the device


@dataclass
class Workload:
    models: list[ModelSpec]
    ts: np.ndarray  # float64 seconds, non-decreasing
    model: np.ndarray  # int index into models, one per request

    def __len__(self) -> int:
        return len(self.ts)

    @property
    def total_bytes(self) -> int:
        return sum(m.size for m in self.models)

    @property
    def tenants(self) -> list[str]:
        return sorted({m.tenant for m in self.models})

    def head(self, n: int) -> Workload:
        return Workload(self.models, self.ts[:n], self.model[:n])


class SyntheticConfig(BaseModel):
    """Synthetic workload. Sizes in bytes, times in seconds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    models: int = Field(1000, ge=1, description="regular models, spread round-robin over the tenants")
    requests: int = Field(100_000, ge=1)
    tenants: int = Field(4, ge=1)
    size_median: float = Field(50e6, gt=0, description="lognormal median model size, bytes")
    size_sigma: float = Field(1.0, ge=0, description="lognormal sigma of model sizes")
    size_min: int = Field(1 << 20, ge=1)
    size_max: int = Field(20 << 30, ge=1)
    zipf: float = Field(0.9, ge=0, description="popularity exponent; 0 is uniform")
    rate: float = Field(100.0, gt=0, description="mean arrivals per second (base rate when bursty)")
    arrivals: Literal["poisson", "bursty"] = "poisson"
    burst_factor: float = Field(10.0, ge=1, description="rate multiplier inside a burst")
    burst_prob: float = Field(0.1, ge=0, le=1, description="chance that a burst period is a burst")
    burst_period_s: float = Field(10.0, gt=0)
    drift_period_s: float = Field(0.0, ge=0, description="0: no drift; else ranks change every period")
    drift_fraction: float = Field(0.1, ge=0, le=1, description="share of models swapping ranks per period")
    noisy_models: int = Field(0, ge=0, description="models of the noisy tenant (0: none)")
    noisy_share: float = Field(0.0, ge=0, le=1, description="share of requests, uniform over its models")
    seed: int = 0


def _arrivals(cfg: SyntheticConfig, rng: np.random.Generator) -> np.ndarray:
    n = cfg.requests
    if cfg.arrivals == "poisson":
        return np.cumsum(rng.exponential(1.0 / cfg.rate, n))
    chunks, total, start = [], 0, 0.0
    while total < n:
        rate = cfg.rate * (cfg.burst_factor if rng.random() < cfg.burst_prob else 1.0)
        k = int(rng.poisson(rate * cfg.burst_period_s))
        chunks.append(np.sort(start + rng.random(k) * cfg.burst_period_s))
        total += k
        start += cfg.burst_period_s
    return np.concatenate(chunks)[:n]


def generate(cfg: SyntheticConfig) -> Workload:
    rng = np.random.default_rng(cfg.seed)
    n_reg, n_noisy = cfg.models, cfg.noisy_models if cfg.noisy_share > 0 else 0
    sizes = np.exp(rng.normal(np.log(cfg.size_median), cfg.size_sigma, n_reg + n_noisy))
    sizes = np.clip(sizes, cfg.size_min, cfg.size_max).astype(np.int64)
    models = [ModelSpec(f"t{i % cfg.tenants}/m{i}/1", f"t{i % cfg.tenants}", int(sizes[i])) for i in range(n_reg)]
    models += [ModelSpec(f"noisy/n{j}/1", "noisy", int(sizes[n_reg + j])) for j in range(n_noisy)]

    ts = _arrivals(cfg, rng)
    n = len(ts)
    cdf = np.cumsum(1.0 / np.arange(1, n_reg + 1) ** cfg.zipf)
    cdf /= cdf[-1]
    ranks = np.minimum(np.searchsorted(cdf, rng.random(n), side="right"), n_reg - 1)
    perm = rng.permutation(n_reg)  # rank -> model index
    if cfg.drift_period_s > 0:
        out = np.empty(n, dtype=np.int64)
        epoch = (ts // cfg.drift_period_s).astype(np.int64)
        bounds = np.flatnonzero(np.diff(epoch)) + 1
        starts = np.concatenate([[0], bounds])
        ends = np.concatenate([bounds, [n]])
        swaps = int(cfg.drift_fraction * n_reg / 2)
        for e, (a, b) in enumerate(zip(starts, ends, strict=True)):
            if e and swaps:
                i, j = rng.integers(0, n_reg, swaps), rng.integers(0, n_reg, swaps)
                for x, y in zip(i, j, strict=True):
                    perm[x], perm[y] = perm[y], perm[x]
            out[a:b] = perm[ranks[a:b]]
        idx = out
    else:
        idx = perm[ranks]
    if n_noisy:
        noisy = rng.random(n) < cfg.noisy_share
        idx = np.where(noisy, n_reg + rng.integers(0, n_noisy, n), idx)
    return Workload(models, ts.astype(np.float64), idx.astype(np.int64))
