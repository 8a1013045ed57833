"""Eviction policies compared on one workload: Zipf 0.9, 1000 models, cache = 10% of all model bytes.
Target (PRODUCT.md): the default policy's total load time <= 0.8x LRU's and <= 1.10x the offline bound.
For mixed sizes the offline figure is a size-aware heuristic with knowledge of the future: an estimate,
not a proven optimum. Prints ratios measured in one run.

    .venv/bin/python bench/sim_policies.py [--requests 500000] [--seeds 3]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hostd.cache.policy import DEFAULT_POLICY  # noqa: E402
from sim.cache_only import run_cache_only  # noqa: E402
from sim.offline import run_offline  # noqa: E402
from sim.workload import SyntheticConfig, generate  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=500_000)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--zipf", type=float, default=0.9)
    a = ap.parse_args()
    print(f"{'seed':>4} {'policy':8} {'hit rate':>8} {'loads':>8} {'load s':>10} {'vs lru':>7} {'vs offline':>10}")
    sums: dict[str, list[float]] = {}
    for seed in range(a.seeds):
        wl = generate(SyntheticConfig(models=1000, requests=a.requests, zipf=a.zipf, seed=seed))
        budget = wl.total_bytes // 10
        res = {p: run_cache_only(wl, budget, p) for p in ("lru", "gdsf")}
        res["offline"] = run_offline(wl, budget)
        lru, off = res["lru"].total.load_s, res["offline"].total.load_s
        for p, r in res.items():
            t = r.total
            sums.setdefault(p, []).append(t.load_s)
            print(f"{seed:>4} {r.policy:8} {t.hits / t.requests:8.3f} {t.loads:8,} {t.load_s:10,.0f} "
                  f"{t.load_s / lru:7.3f} {t.load_s / off:10.3f}")
    lru, off = sum(sums["lru"]), sum(sums["offline"])
    print(f"\nover {a.seeds} seeds, {a.requests:,} requests each (offline: size-aware estimate):")
    for p in ("lru", "gdsf"):
        s = sum(sums[p])
        print(f"  {p:5s} load time = {s / lru:.3f}x LRU, {s / off:.3f}x offline")
    d = sum(sums[DEFAULT_POLICY])
    print(f"default policy ({DEFAULT_POLICY}): {d / lru:.3f}x LRU (target <= 0.8: {'ok' if d / lru <= 0.8 else 'MISSED'}),"
          f" {d / off:.3f}x offline (target <= 1.10: {'ok' if d / off <= 1.10 else 'MISSED'})")
    g = sum(sums["gdsf"])
    print(f"gdsf as default would give: {g / lru:.3f}x LRU, {g / off:.3f}x offline")


if __name__ == "__main__":
    main()
