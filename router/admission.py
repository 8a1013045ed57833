"""The router's admission state: each tenant's quota (from the tenant registry, replaced on every refresh)
and bucket/in-flight state between requests. Decisions come from router/admission_policy.py (per router) and
router/quota_policy.py (fleet-wide); this class holds the state and reads no clock (the servicer passes `now`).

Embedded mode (no `fleet`): every router enforces each limit in full on its own traffic. Redis mode (a
router/fleet_quota.py `FleetQuota`): the limits hold across all routers together, rate through token leases
from the tenant's bucket in Redis, concurrency as this router's share; while Redis is unreachable, each
limit's share (limit / routers seen) through the per-router policy."""

from __future__ import annotations

from collections.abc import Mapping

from ground.tenancy import DEFAULT, TenantLimits
from router.admission_policy import Decision, Quota, TenantState, admit, release
from router.fleet_quota import FLEET, FleetQuota
from router.quota_policy import admit_leased, share


def quota_of(limits: TenantLimits) -> Quota:
    return Quota(rate=limits.rate, burst=limits.burst, max_concurrency=limits.max_concurrency)


class Admission:
    def __init__(self, limits: Mapping[str, TenantLimits] | None = None, fleet: FleetQuota | None = None) -> None:
        self._quotas: dict[str, Quota] = {}
        self._states: dict[str, TenantState] = {}
        self._default = quota_of(DEFAULT)
        self.fleet = fleet
        self.replace(limits or {})

    def replace(self, limits: Mapping[str, TenantLimits]) -> None:
        """New limits from the registry; buckets and in-flight counts carry over."""
        self._quotas = {t: quota_of(lim) for t, lim in limits.items()}

    def quota(self, tenant: str) -> Quota:
        return self._quotas.get(tenant, self._default)

    async def ready(self, tenant: str) -> None:
        """Before `enter`, in Redis mode: the tenant's lease topped up (a Redis call only when it runs low)."""
        if self.fleet is not None:
            await self.fleet.ready(tenant, self.quota(tenant))

    def enter(self, tenant: str, now: float, busy_retry_ms: int = 10) -> Decision:
        state, quota, fleet = self._states.get(tenant, TenantState()), self.quota(tenant), self.fleet
        if fleet is None:
            d = admit(state, quota, now, busy_retry_ms=busy_retry_ms)
        elif fleet.mode == FLEET:
            d, fleet.leases[tenant] = admit_leased(state, fleet.lease(tenant), quota, fleet.routers, now,
                                                   busy_retry_ms=busy_retry_ms)
        else:
            d = admit(state, share(quota, fleet.routers), now, busy_retry_ms=busy_retry_ms)
        self._states[tenant] = d.state
        return d

    def leave(self, tenant: str) -> None:
        st = self._states.get(tenant)
        if st is not None:
            self._states[tenant] = release(st)

    def inflight(self, tenant: str) -> int:
        st = self._states.get(tenant)
        return st.inflight if st else 0
