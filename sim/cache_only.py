"""Fast path: drive only the eviction policy, request by request, with no batching and no latency.

Each request: the model resident -> hit (policy.on_access); else plan_eviction for the load, evict, and
load it (load time from the cost model and the tier it comes from). A load the plan refuses is shed
(UNAVAILABLE), as hostd refuses it. Models load instantly here, so nothing is ever busy.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping

from hostd.cache.policy import Resident, Share, bytes_to_free, make_policy, plan_eviction
from sim.costs import CostModel
from sim.stats import SimResult, TenantStats
from sim.tiers import Tiers
from sim.workload import Workload

Progress = Callable[[int], None]  # called with requests done since the last call


def run_cache_only(
    wl: Workload,
    cache_bytes: int,
    policy: str = "lru",
    costs: CostModel | None = None,
    shares: Mapping[str, Share] | None = None,
    high: float = 1.0,
    low: float = 1.0,
    host_ram_bytes: int = 0,
    pinned: Collection[str] = (),
    progress: Progress | None = None,
) -> SimResult:
    costs = costs or CostModel()
    pol = make_policy(policy)
    tiers = Tiers(host_ram_bytes)
    models = wl.models
    sizes = [m.size for m in models]
    tenant_names = sorted({m.tenant for m in models})
    tid = {t: i for i, t in enumerate(tenant_names)}
    mten = [tid[m.tenant] for m in models]
    rcost = [costs.load_seconds(s, tiers.reload_tier) for s in sizes]
    pinned_idx = {i for i, m in enumerate(models) if m.key in pinned}
    nt = len(tenant_names)
    req, hit, loads, shed, breq, bmiss = ([0] * nt for _ in range(6))
    load_s = [0.0] * nt
    tbytes = dict.fromkeys(tenant_names, 0)
    residents: dict[int, Resident] = {}
    used = 0
    on_access, on_evict = pol.on_access, pol.on_evict
    ts_list, idx_list = wl.ts.tolist(), wl.model.tolist()
    step = 1 << 16

    for n, (now, m) in enumerate(zip(ts_list, idx_list)):
        if progress is not None and n and not n % step:
            progress(step)
        t = mten[m]
        size = sizes[m]
        req[t] += 1
        breq[t] += size
        r = residents.get(m)
        if r is not None:
            hit[t] += 1
            r.hits += 1
            r.last_use = now
            on_access(m, now, size, rcost[m])
            continue
        bmiss[t] += size
        need = bytes_to_free(used, cache_bytes, high, low, size)
        if need > 0 or shares:
            plan = plan_eviction(
                pol, residents, need, models[m].tenant, shares, now, incoming_bytes=size, tenant_bytes=tbytes
            )
            if not plan.ok:
                shed[t] += 1
                continue
            for k in plan.evict:
                v = residents.pop(k)
                used -= v.size
                tbytes[v.tenant] -= v.size
                on_evict(k)
                tiers.on_evict(k, v.size)
        loads[t] += 1
        load_s[t] += costs.load_seconds(size, tiers.tier_of(m))
        tiers.on_load(m)
        residents[m] = Resident(m, models[m].tenant, size, now, rcost[m], 1, False, m in pinned_idx)
        used += size
        tbytes[models[m].tenant] += size
        on_access(m, now, size, rcost[m])
    if progress is not None:
        progress(len(ts_list) % step or (step if ts_list else 0))

    stats = {
        name: TenantStats(req[i], hit[i], loads[i], shed[i], breq[i], bmiss[i], load_s[i])
        for i, name in enumerate(tenant_names)
    }
    return SimResult(policy, cache_bytes, stats, {"unavailable": sum(shed)} if sum(shed) else {})
