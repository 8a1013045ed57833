"""Fast path: drive only the device cache (the host core's DeviceCache, over the eviction policy), request
by request, with no batching and no latency.

Each request: the model resident -> hit (`access`); else `reserve` its load (the plan evicts first), evict
what the plan names, and load it (load time from the cost model and the tier it comes from). A load the
plan refuses is shed (UNAVAILABLE), as hostd refuses it. Models load instantly here, so nothing is busy.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping

from hostd.cache.policy import EvictionPolicy, Share
from hostd.core.device import DeviceCache
from sim.costs import CostModel
from sim.stats import SimResult, TenantStats
from sim.tiers import Tiers
from sim.workload import Workload

Progress = Callable[[int], None]  # called with requests done since the last call


def run_cache_only(
    wl: Workload,
    cache_bytes: int,
    policy: str | EvictionPolicy = "lru",
    costs: CostModel | None = None,
    shares: Mapping[str, Share] | None = None,
    high: float = 1.0,
    low: float = 1.0,
    host_ram_bytes: int = 0,
    pinned: Collection[str] = (),
    progress: Progress | None = None,
) -> SimResult:
    costs = costs or CostModel()
    cache = DeviceCache(cache_bytes, high, low, policy, shares)
    tiers = Tiers(host_ram_bytes)
    models = wl.models
    sizes = [m.size for m in models]
    mtenant = [m.tenant for m in models]
    tenant_names = sorted(set(mtenant))
    tid = {t: i for i, t in enumerate(tenant_names)}
    mten = [tid[t] for t in mtenant]
    rcost = [costs.load_seconds(s, tiers.reload_tier) for s in sizes]
    pinned_idx = {i for i, m in enumerate(models) if m.key in pinned}
    nt = len(tenant_names)
    req, hit, loads, shed, breq, bmiss = ([0] * nt for _ in range(6))
    load_s = [0.0] * nt
    access, reserve, loaded, release = cache.access, cache.reserve, cache.loaded, cache.release
    ts_list, idx_list = wl.ts.tolist(), wl.model.tolist()
    step = 1 << 16

    for n, (now, m) in enumerate(zip(ts_list, idx_list, strict=True)):
        if progress is not None and n and not n % step:
            progress(step)
        t = mten[m]
        size = sizes[m]
        req[t] += 1
        breq[t] += size
        if access(m, now):
            hit[t] += 1
            continue
        bmiss[t] += size
        plan = reserve(m, mtenant[m], size, now, m in pinned_idx)
        if not plan.ok:
            shed[t] += 1
            continue
        for k in plan.evict:
            tiers.on_evict(k, release(k).size)
        loads[t] += 1
        load_s[t] += costs.load_seconds(size, tiers.tier_of(m))
        tiers.on_load(m)
        loaded(m, size, rcost[m], now)
    if progress is not None:
        progress(len(ts_list) % step or (step if ts_list else 0))

    stats = {
        name: TenantStats(req[i], hit[i], loads[i], shed[i], breq[i], bmiss[i], load_s[i])
        for i, name in enumerate(tenant_names)
    }
    return SimResult(cache.policy.name, cache_bytes, stats, {"unavailable": sum(shed)} if sum(shed) else {})
