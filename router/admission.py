"""The router's admission state: each tenant's quota (from the tenant registry, replaced on every refresh)
and bucket/in-flight state between requests. Decisions come from router/admission_policy.py; this class
holds the state and reads no clock (the servicer passes `now`)."""

from __future__ import annotations

from collections.abc import Mapping

from ground.tenancy import DEFAULT, TenantLimits
from router.admission_policy import Decision, Quota, TenantState, admit, release


def quota_of(limits: TenantLimits) -> Quota:
    return Quota(rate=limits.rate, burst=limits.burst, max_concurrency=limits.max_concurrency)


class Admission:
    def __init__(self, limits: Mapping[str, TenantLimits] | None = None) -> None:
        self._quotas: dict[str, Quota] = {}
        self._states: dict[str, TenantState] = {}
        self._default = quota_of(DEFAULT)
        self.replace(limits or {})

    def replace(self, limits: Mapping[str, TenantLimits]) -> None:
        """New limits from the registry; buckets and in-flight counts carry over."""
        self._quotas = {t: quota_of(lim) for t, lim in limits.items()}

    def quota(self, tenant: str) -> Quota:
        return self._quotas.get(tenant, self._default)

    def enter(self, tenant: str, now: float, busy_retry_ms: int = 10) -> Decision:
        d = admit(self._states.get(tenant, TenantState()), self.quota(tenant), now, busy_retry_ms=busy_retry_ms)
        self._states[tenant] = d.state
        return d

    def leave(self, tenant: str) -> None:
        st = self._states.get(tenant)
        if st is not None:
            self._states[tenant] = release(st)

    def inflight(self, tenant: str) -> int:
        st = self._states.get(tenant)
        return st.inflight if st else 0
