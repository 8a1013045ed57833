"""Tenant tiers and limits, shared by the router (admission: rate, burst, concurrency) and hostd (fair
execution weight, instances per model, device-memory shares).

A tenant's limits are its tier's defaults with any field overridden per tenant. Stored with the tenant
registry (Redis or the embedded tenants file) and set with `mmhost tenant set-limits`.
"""

from __future__ import annotations

from pydantic import BaseModel, Field


class TenantLimits(BaseModel):
    tier: str = "standard"
    weight: float = Field(1.0, gt=0, description="share of device execution time relative to other tenants")
    rate: float = Field(0.0, ge=0, description="requests per second admitted across all routers (Redis mode; "
                        "each router alone in embedded mode); 0 = unlimited")
    burst: int = Field(0, ge=0, description="token bucket size; 0 = max(1, rate)")
    max_concurrency: int = Field(0, ge=0, description="requests in flight across all routers (split evenly between "
                                 "the live routers in Redis mode); 0 = unlimited")
    default_priority: int = Field(0, ge=0, description="priority level for requests that name none (0 = model default)")
    instances: int = Field(0, ge=0, description="executors per model on each host; 0 = the model's own instance_count")
    device_guaranteed: str = Field("0", description="device memory no other tenant's load can take (bytes or fraction)")
    device_maximum: str | None = Field(None, description="device memory this tenant may hold at most")


TIERS: dict[str, TenantLimits] = {
    "free": TenantLimits(tier="free", weight=1.0, rate=10, burst=20, max_concurrency=4, instances=1),
    "standard": TenantLimits(tier="standard", weight=2.0, rate=100, burst=200, max_concurrency=32),
    "premium": TenantLimits(tier="premium", weight=4.0, rate=1000, burst=2000, max_concurrency=256, instances=2,
                            device_guaranteed="0.2"),
    "unlimited": TenantLimits(tier="unlimited", weight=1.0),
}

DEFAULT = TIERS["unlimited"]


def limits_for(tier: str, overrides: dict | None = None) -> TenantLimits:
    """A tier's defaults with per-tenant overrides applied (unknown tier: ValueError)."""
    if tier not in TIERS:
        raise ValueError(f"unknown tier {tier!r}; known: {', '.join(TIERS)}")
    base = TIERS[tier].model_dump()
    base.update({k: v for k, v in (overrides or {}).items() if v is not None})
    base["tier"] = tier
    return TenantLimits.model_validate(base)


def spec_limits(spec: dict | None) -> TenantLimits:
    """A stored spec {"tier": T, overrides} -> limits; {} or None (a record from before limits) -> "unlimited"."""
    spec = dict(spec or {})
    return limits_for(spec.pop("tier", "unlimited"), spec)
