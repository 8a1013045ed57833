"""What hostd knows of tenants: their limits (weight for fair execution, instances per model, default
priority, device shares). Unknown tenants get the default (weight 1, the model's own instance count).

Sources, re-read every few seconds by the composition root (hostd/server.py):
- RedisLimits (cluster mode, `--redis`): the tenant registry the routers use, HASH `<prefix>by-name`
  (tenant -> JSON record with "limits", see router/tenants.py).
- FileLimits (embedded mode, `--tenant-limits FILE`): either the routers' tenants file
  ({"tenants": {name: {..., "limits": {...}}}}, so one file configures both) or a plain
  {tenant: {"tier": ..., overrides}} file. Re-read when its modification time changes.
A record without limits reads as tier "unlimited".

Device shares come from two places: the registry's `device_guaranteed`/`device_maximum` (the live lever:
`mmhost tenant set-limits T --device-maximum 30%`, applied at the next refresh, no restart) and the hostd setting
`tenant_shares` (env MMHOST_HOSTD_TENANT_SHARES, read once at start). The registry wins for a tenant it sets a
share for; the setting gives shares to the others (merge_shares). A setting overridden this way is logged and
counted (mmhost_tenant_env_shares_overridden), never silently dropped."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from pathlib import Path

from hostd.cache.policy import Share
from ground.tenancy import DEFAULT, TenantLimits, limits_for, spec_limits
from ground.units import parse_bytes

log = logging.getLogger(__name__)


def parse_limits(raw: dict) -> dict[str, TenantLimits]:
    """{tenant: {"tier": "premium", ...overrides}} -> limits per tenant."""
    out = {}
    for tenant, spec in raw.items():
        spec = dict(spec or {})
        out[tenant] = limits_for(spec.pop("tier", "unlimited"), spec)
    return out


def parse_records(records: dict) -> dict[str, TenantLimits]:
    """The tenant registry's records {tenant: {"key_sha256": ..., "limits": {...}}} -> limits per tenant."""
    return {tenant: spec_limits(rec.get("limits")) for tenant, rec in records.items()}


def parse_any(raw: dict) -> dict[str, TenantLimits]:
    tenants = raw.get("tenants")
    if isinstance(tenants, dict) and all(isinstance(r, dict) and "key_sha256" in r for r in tenants.values()):
        return parse_records(tenants)  # the routers' tenants file
    return parse_limits(raw)


def load_limits_file(path: str | Path) -> dict[str, TenantLimits]:
    return parse_any(json.loads(Path(path).read_text()))


class FileLimits:
    """Embedded mode: the tenants file; read() is None while the file is unchanged."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._seen: int | None = None

    async def read(self) -> dict[str, TenantLimits] | None:
        try:
            mtime = self.path.stat().st_mtime_ns
        except FileNotFoundError:
            mtime = 0
        if mtime == self._seen:
            return None
        limits = load_limits_file(self.path) if mtime else {}
        self._seen = mtime
        return limits


class RedisLimits:
    """Cluster mode: the tenant registry in Redis (the HASH routers and `mmhost tenant` write)."""

    def __init__(self, redis_url: str, prefix: str) -> None:
        import redis.asyncio as aredis

        self._r = aredis.Redis.from_url(redis_url, socket_timeout=2, socket_connect_timeout=2, decode_responses=True)
        self.key = f"{prefix}by-name"
        self.ready_key = f"{prefix}ready"  # present while Redis's tenant set is whole (router/tenants.py)
        self._last: dict[str, TenantLimits] | None = None

    async def read(self) -> dict[str, TenantLimits]:
        """The registry's limits. While the `ready` marker is absent (Redis flushed, restarted empty, an empty
        replica) Redis's set is not the truth: the last set read while it was is kept, with anything new
        added, until `mmhost tenant rebuild` restores the index from storage."""
        async with self._r.pipeline(transaction=False) as p:
            p.exists(self.ready_key)
            p.hgetall(self.key)
            ready, raw = await p.execute()
        limits = parse_records({t: json.loads(v) for t, v in raw.items()})
        if ready or self._last is None:
            self._last = limits
            return limits
        return {**self._last, **limits}

    async def close(self) -> None:
        await self._r.aclose()


class TenantLimitsView:
    def __init__(self, limits: dict[str, TenantLimits] | None = None) -> None:
        self._limits = dict(limits or {})

    def get(self, tenant: str) -> TenantLimits:
        return self._limits.get(tenant, DEFAULT)

    def weight(self, tenant: str) -> float:
        return self.get(tenant).weight

    def replace(self, limits: dict[str, TenantLimits]) -> None:
        self._limits = dict(limits)

    def tenants(self) -> dict[str, TenantLimits]:
        return dict(self._limits)

    def shares(self, budget: int) -> dict[str, Share]:
        out = {}
        for tenant, lim in self._limits.items():
            g = parse_bytes(lim.device_guaranteed, budget)
            mx = parse_bytes(lim.device_maximum, budget) if lim.device_maximum is not None else None
            if g or mx is not None:
                out[tenant] = Share(guaranteed=g, maximum=mx)
        return out


def merge_shares(registry: dict[str, Share], env: dict[str, Share]) -> tuple[dict[str, Share], list[str]]:
    """Each tenant's device share: the registry's when it sets one, else the environment's. Returns the shares
    and the tenants whose environment share the registry overrides (sorted)."""
    return {**env, **registry}, sorted(env.keys() & registry.keys())


async def refresh_once(source, apply: Callable[[dict[str, TenantLimits]], None]) -> None:
    limits = await source.read()
    if limits is not None:
        apply(limits)


async def refresh_loop(source, apply: Callable[[dict[str, TenantLimits]], None], interval_s: float) -> None:
    """Re-read the limits every `interval_s`; a failed read keeps the last limits and is logged once."""
    failing = False
    while True:
        await asyncio.sleep(interval_s)
        try:
            await refresh_once(source, apply)
            if failing:
                log.info("tenant limits refresh resumed")
            failing = False
        except Exception as e:  # noqa: BLE001 - keep the last limits; say so once
            if not failing:
                log.warning("refreshing tenant limits failed (keeping the last ones): %s", e)
            failing = True
