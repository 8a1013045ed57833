"""Offline eviction with knowledge of the future: the yardstick for the online policies.

Equal sizes and equal reload costs: Belady's MIN (evict the resident used again farthest in the future),
which minimises misses and therefore load time: a true bound (lower bound on misses and load time).
Mixed sizes or costs: a size-aware heuristic that is an ESTIMATE, not a proven optimum (the exact problem
is NP-hard): evict first the residents with the largest size * (distance to next use) / reload cost, i.e.
those whose bytes are held longest per second of load time they would save. Distance counts requests.
Both must load every missed model (no bypass), as hostd must; tenant shares and pins are ignored.
"""

from __future__ import annotations

import heapq

import numpy as np

from sim.costs import CostModel
from sim.stats import SimResult, TenantStats
from sim.tiers import Tiers
from sim.workload import Workload


def next_use(model: np.ndarray) -> np.ndarray:
    """For each request, the index of the next request for the same model (len(model) if none)."""
    n = len(model)
    out = np.full(n, n, dtype=np.int64)
    last: dict[int, int] = {}
    for i in range(n - 1, -1, -1):
        m = int(model[i])
        out[i] = last.get(m, n)
        last[m] = i
    return out


def run_offline(
    wl: Workload, cache_bytes: int, costs: CostModel | None = None, host_ram_bytes: int = 0, exact: bool | None = None
) -> SimResult:
    """exact: force MIN (True) or the heuristic (False); None picks MIN when all sizes are equal."""
    costs = costs or CostModel()
    tiers = Tiers(host_ram_bytes)
    sizes = np.array([m.size for m in wl.models], dtype=np.int64)
    if exact is None:
        exact = bool((sizes == sizes[0]).all())
    rcost = np.array([costs.load_seconds(int(s), tiers.reload_tier) for s in sizes])
    names = sorted({m.tenant for m in wl.models})
    tid = {t: i for i, t in enumerate(names)}
    mten = [tid[m.tenant] for m in wl.models]
    stats = [TenantStats() for _ in names]
    nxt = next_use(wl.model).tolist()
    size_l = sizes.tolist()
    resident = np.zeros(len(sizes), dtype=bool)
    nu = np.zeros(len(sizes), dtype=np.float64)  # next use of each resident
    heap: list[tuple[int, int]] = []  # (-next use, model), stale entries skipped (exact mode)
    used = 0
    name = "offline" if exact else "offline~"
    shed = 0

    for i, m in enumerate(wl.model.tolist()):
        s = stats[mten[m]]
        size = size_l[m]
        s.requests += 1
        s.bytes_requested += size
        if resident[m]:
            s.hits += 1
        else:
            s.bytes_missed += size
            if size > cache_bytes:
                s.shed += 1
                shed += 1
                continue
            if used + size > cache_bytes:
                if exact:
                    while used + size > cache_bytes:
                        negn, v = heapq.heappop(heap)
                        if resident[v] and nu[v] == -negn:
                            resident[v] = False
                            used -= size_l[v]
                            tiers.on_evict(v, size_l[v])
                else:
                    idx = np.flatnonzero(resident)
                    score = sizes[idx] * (nu[idx] - i) / rcost[idx]
                    for v in idx[np.argsort(-score, kind="stable")].tolist():
                        resident[v] = False
                        used -= size_l[v]
                        tiers.on_evict(v, size_l[v])
                        if used + size <= cache_bytes:
                            break
            s.loads += 1
            s.load_s += costs.load_seconds(size, tiers.tier_of(m))
            tiers.on_load(m)
            resident[m] = True
            used += size
        nu[m] = nxt[i]
        if exact:
            heapq.heappush(heap, (-nxt[i], m))
    return SimResult(name, cache_bytes, dict(zip(names, stats, strict=True)), {"unavailable": shed} if shed else {})
