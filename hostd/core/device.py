"""The device tier's bookkeeping: resident models (loaded or loading) with their sizes, the byte budget with
its watermarks, per-tenant shares, and the eviction policy object.

Counters are incremental: `used` and the bytes per tenant change in reserve / loaded / release, never by a
sum over residents. Busy and pinned flags are set per key (`set_busy`, `set_pinned`) by whoever knows they
changed. Decisions come from the pure code in hostd/cache/policy.py. No I/O, no clock: pass `now`.

Who drives it: hostd/manager.py and hostd/eviction.py (asyncio), sim/cluster.py and sim/cache_only.py.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping

from hostd.cache.policy import EvictionPlan, EvictionPolicy, Resident, Share, bytes_to_free, make_policy, plan_eviction


_OK = EvictionPlan(True)


class DeviceCache:
    def __init__(self, budget: int, high: float = 1.0, low: float = 1.0, policy: str | EvictionPolicy = "lru",
                 shares: Mapping[str, Share] | None = None) -> None:
        if not 0 < low <= high <= 1:
            raise ValueError(f"watermarks need 0 < low ({low}) <= high ({high}) <= 1")
        self.budget = budget
        self.high = high
        self.low = low
        self.shares: Mapping[str, Share] = shares or {}
        self.policy = make_policy(policy)
        self._on_access = self.policy.on_access  # bound once: access() is the simulator's hot path
        self.residents: dict[Hashable, Resident] = {}
        self.used = 0  # bytes of all residents, kept up to date by reserve / loaded / release
        self._tenant: dict[str, int] = {}

    @property
    def free_bytes(self) -> int:
        return self.budget - self.used

    def tenant_bytes(self) -> dict[str, int]:
        """Bytes held per tenant (a copy)."""
        return {t: n for t, n in self._tenant.items() if n}

    def __contains__(self, key: Hashable) -> bool:
        return key in self.residents

    def set_busy(self, key: Hashable, busy: bool) -> None:
        """Requests queued or running (or a load or unload under way): never evicted."""
        r = self.residents.get(key)
        if r is not None:
            r.busy = busy

    def set_pinned(self, key: Hashable, pinned: bool) -> None:
        r = self.residents.get(key)
        if r is not None:
            r.pinned = pinned

    def _add(self, tenant: str, delta: int) -> None:
        self.used += delta
        self._tenant[tenant] = self._tenant.get(tenant, 0) + delta

    def reserve(self, key: Hashable, tenant: str, size: int, now: float, pinned: bool = False) -> EvictionPlan:
        """Room for a load of `size` bytes (an estimate until measured). On success the model is counted at
        once (busy, so nobody evicts it while it loads) and the plan names the models to evict; the caller
        evicts them and calls `release` for each."""
        if size > self.budget:
            return EvictionPlan(False, reason=f"the model needs {size} bytes, the device budget is {self.budget}")
        need = bytes_to_free(self.used, self.budget, self.high, self.low, incoming=size)
        if need > 0 or self.shares:
            plan = plan_eviction(self.policy, self.residents, need, tenant, self.shares,
                                 incoming_bytes=size, tenant_bytes=self._tenant)
            if not plan.ok:
                return plan
        else:
            plan = _OK
        if key in self.residents:
            self.release(key)
        self.residents[key] = Resident(key, tenant, size, now, 0.0, 0, True, pinned)
        self.used += size
        tb = self._tenant
        tb[tenant] = tb.get(tenant, 0) + size
        return plan

    def loaded(self, key: Hashable, size: int, load_cost: float, now: float) -> None:
        """The load finished: `size` is the measured size. Not busy any more until the caller says so."""
        r = self.residents[key]
        if size != r.size:
            self._add(r.tenant, size - r.size)
            r.size = size
        r.load_cost = load_cost
        r.last_use = now
        r.hits = 1
        r.busy = False
        self.policy.on_access(key, now, size, load_cost)

    def access(self, key: Hashable, now: float) -> bool:
        """A request served from the device; False when the key is not resident."""
        r = self.residents.get(key)
        if r is None:
            return False
        r.last_use = now
        r.hits += 1
        self._on_access(key, now, r.size, r.load_cost)
        return True

    def release(self, key: Hashable) -> Resident | None:
        """The model left the device (evicted, unloaded, or its load failed); returns its record."""
        r = self.residents.pop(key, None)
        if r is not None:
            self.used -= r.size
            self._tenant[r.tenant] -= r.size
            self.policy.on_evict(key)
        return r

    def watermark_plan(self, now: float, measured_used: int | None = None) -> EvictionPlan:
        """Best effort: once use passes the high watermark, what to evict to get under the low one.
        `measured_used` (e.g. NVML's reading on a GPU) overrides the sum of per-model sizes when larger."""
        used = max(self.used, measured_used or 0)
        need = bytes_to_free(used, self.budget, self.high, self.low)
        if need <= 0:
            return EvictionPlan(True)
        return plan_eviction(self.policy, self.residents, need, None, self.shares, tenant_bytes=self._tenant)
