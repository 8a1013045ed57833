"""The device tier's bookkeeping: resident models with their measured sizes, the byte budget with its
watermarks, per-tenant shares, and the eviction policy object. Decisions come from the pure code in
policy.py; this class holds the state between calls and does no I/O and reads no clock."""

from __future__ import annotations

from collections.abc import Callable, Hashable

from hostd.cache.policy import EvictionPlan, Resident, Share, bytes_to_free, make_policy, plan_eviction, tenant_usage


class DeviceCache:
    def __init__(self, budget: int, high: float, low: float, policy: str = "lru", shares: dict[str, Share] | None = None) -> None:
        if not 0 < low <= high <= 1:
            raise ValueError(f"watermarks need 0 < low ({low}) <= high ({high}) <= 1")
        self.budget = budget
        self.high = high
        self.low = low
        self.shares = shares or {}
        self.policy = make_policy(policy)
        self.residents: dict[Hashable, Resident] = {}

    @property
    def used(self) -> int:
        return sum(r.size for r in self.residents.values())

    def tenant_bytes(self) -> dict[str, int]:
        return tenant_usage(self.residents)

    def refresh(self, busy: Callable[[Hashable], bool], pinned: Callable[[Hashable], bool]) -> None:
        for key, r in self.residents.items():
            r.busy = busy(key)
            r.pinned = pinned(key)

    def reserve(self, key: Hashable, tenant: str, size: int, now: float) -> EvictionPlan:
        """Room for a load of `size` bytes (an estimate until measured). On success the model is counted
        at once (busy, so nobody evicts it while it loads) and the plan names the models to evict first."""
        need = bytes_to_free(self.used, self.budget, self.high, self.low, incoming=size)
        if size > self.budget:
            return EvictionPlan(False, reason=f"the model needs {size} bytes, the device budget is {self.budget}")
        plan = plan_eviction(self.policy, self.residents, need, tenant, self.shares, now, incoming_bytes=size)
        if plan.ok:
            self.residents[key] = Resident(key=key, tenant=tenant, size=size, last_use=now, busy=True)
        return plan

    def loaded(self, key: Hashable, size: int, load_cost: float, now: float) -> None:
        r = self.residents[key]
        r.size = size
        r.load_cost = load_cost
        r.last_use = now
        r.hits = 1
        r.busy = False  # from now on busy means work queued or running; the caller refreshes it
        self.policy.on_access(key, now, size, load_cost)

    def access(self, key: Hashable, now: float) -> None:
        r = self.residents.get(key)
        if r is None:
            return
        r.last_use = now
        r.hits += 1
        self.policy.on_access(key, now, r.size, r.load_cost)

    def release(self, key: Hashable) -> None:
        """The model left the device (evicted, unloaded, or its load failed)."""
        if self.residents.pop(key, None) is not None:
            self.policy.on_evict(key)

    def watermark_plan(self, now: float, measured_used: int | None = None) -> EvictionPlan:
        """Best effort: once use passes the high watermark, what to evict to get under the low one.
        `measured_used` (e.g. NVML's reading on a GPU) overrides the sum of per-model sizes when larger."""
        used = max(self.used, measured_used or 0)
        need = bytes_to_free(used, self.budget, self.high, self.low)
        if need <= 0:
            return EvictionPlan(True)
        return plan_eviction(self.policy, self.residents, need, None, self.shares, now)
