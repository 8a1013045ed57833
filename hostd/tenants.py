"""What hostd knows of tenants: their limits (weight for fair execution, instances per model, default
priority, device shares). Loaded from a JSON file in embedded mode, refreshed from the tenant registry in
Redis in cluster mode; unknown tenants get the default (weight 1, the model's own instance count)."""

from __future__ import annotations

import json
from pathlib import Path

from hostd.cache.policy import Share
from mmhost.tenancy import DEFAULT, TenantLimits, limits_for
from mmhost.units import parse_bytes


def parse_limits(raw: dict) -> dict[str, TenantLimits]:
    """{tenant: {"tier": "premium", ...overrides}} -> limits per tenant."""
    out = {}
    for tenant, spec in raw.items():
        spec = dict(spec or {})
        out[tenant] = limits_for(spec.pop("tier", "unlimited"), spec)
    return out


def load_limits_file(path: str | Path) -> dict[str, TenantLimits]:
    return parse_limits(json.loads(Path(path).read_text()))


class TenantLimitsView:
    def __init__(self, limits: dict[str, TenantLimits] | None = None) -> None:
        self._limits = dict(limits or {})

    def get(self, tenant: str) -> TenantLimits:
        return self._limits.get(tenant, DEFAULT)

    def weight(self, tenant: str) -> float:
        return self.get(tenant).weight

    def replace(self, limits: dict[str, TenantLimits]) -> None:
        self._limits = dict(limits)

    def shares(self, budget: int) -> dict[str, Share]:
        out = {}
        for tenant, lim in self._limits.items():
            g = parse_bytes(lim.device_guaranteed, budget)
            mx = parse_bytes(lim.device_maximum, budget) if lim.device_maximum is not None else None
            if g or mx is not None:
                out[tenant] = Share(guaranteed=g, maximum=mx)
        return out
