"""Eviction policies compared on two workloads, cache = 10% of all model bytes, every model loaded from storage
(the default cost model: 0.1 s + 5 ns per byte):
- zipf:   Zipf 0.9 over 1000 models, Poisson arrivals (a stable popularity);
- bursty: the same 1000 models with bursty arrivals and popularity drift (10% of ranks swap every 60 s),
          plus a noisy tenant spreading 30% of the requests evenly over 2000 models of its own (a scan).

Policies: lru (the default), gdsf, gdsf-decay (hostd/cache/policy.py), and two references that know the
future: "oracle", a static policy that knows each model's true popularity over the whole trace (keeps the
models with the highest popularity x load cost / size; no recency), and the offline figure (sim/offline.py;
with mixed sizes "offline~", a size-aware heuristic with knowledge of the future: an estimate of the bound,
not a proven optimum). Prints, per workload and seed, each policy's hit rate, loads and total load time, vs
LRU and vs offline, then the totals over seeds. Ratios measured in one run; no assertion here.

    .venv/bin/python bench/sim_policies.py [--requests 500000] [--seeds 3] [--workload zipf --workload bursty]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from hostd.cache.policy import DEFAULT_POLICY, GDSFPolicy, Key  # noqa: E402
from sim.cache_only import run_cache_only  # noqa: E402
from sim.offline import run_offline  # noqa: E402
from sim.workload import SyntheticConfig, Workload, generate  # noqa: E402

ONLINE = ("lru", "gdsf", "gdsf-decay")


class OraclePolicy(GDSFPolicy):
    """Evicts the lowest popularity x load cost / size first, popularity being the model's share of the whole
    trace's requests (known in advance): the best static choice, blind to recency and bursts."""

    name = "oracle"

    def __init__(self, popularity: Mapping[Key, float]) -> None:
        super().__init__()
        self.popularity = popularity

    def on_access(self, key: Key, now: float, size: int, cost: float) -> None:
        self._push(key, self.popularity.get(key, 0.0) * cost / max(size, 1))

    def on_evict(self, key: Key) -> None:
        if self._prio.pop(key, None) is not None:
            del self._stamp[key]


def workload(name: str, requests: int, seed: int) -> Workload:
    if name == "zipf":
        return generate(SyntheticConfig(models=1000, requests=requests, zipf=0.9, seed=seed))
    return generate(SyntheticConfig(models=1000, requests=requests, zipf=0.9, arrivals="bursty", rate=100,
                                    drift_period_s=60, noisy_models=2000, noisy_share=0.3, seed=seed))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=500_000)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--workload", action="append", choices=("zipf", "bursty"))
    a = ap.parse_args()
    names = ["lru", "gdsf", "gdsf-decay", "oracle", "offline"]
    for wname in a.workload or ["zipf", "bursty"]:
        print(f"\n== {wname}: {a.requests:,} requests per seed, cache 10% of all model bytes ==")
        print(f"{'seed':>4} {'policy':11} {'hit rate':>8} {'loads':>8} {'load s':>10} {'vs lru':>7} {'vs offline':>10}")
        sums: dict[str, float] = {}
        label: dict[str, str] = {}
        for seed in range(a.seeds):
            wl = workload(wname, a.requests, seed)
            budget = wl.total_bytes // 10
            counts = np.bincount(wl.model, minlength=len(wl.models)) / len(wl)
            res = {p: run_cache_only(wl, budget, p) for p in ONLINE}
            res["oracle"] = run_cache_only(wl, budget, OraclePolicy(dict(enumerate(counts.tolist()))))
            res["offline"] = run_offline(wl, budget)
            lru, off = res["lru"].total.load_s, res["offline"].total.load_s
            for p, r in res.items():
                t = r.total
                sums[p] = sums.get(p, 0.0) + t.load_s
                label[p] = r.policy
                print(f"{seed:>4} {r.policy:11} {t.hits / t.requests:8.3f} {t.loads:8,} {t.load_s:10,.0f} "
                      f"{t.load_s / lru:7.3f} {t.load_s / off:10.3f}")
        lru, off = sums["lru"], sums["offline"]
        bound = "offline bound" if label["offline"] == "offline" else "offline~ (heuristic estimate of the bound)"
        print(f"\n{wname}, over {a.seeds} seed(s): total load time vs LRU and vs {bound}")
        for p in names:
            print(f"  {label[p]:11s} {sums[p] / lru:6.3f}x LRU  {sums[p] / off:6.3f}x offline")
        d, o, g = sums[DEFAULT_POLICY], sums["oracle"], sums["gdsf-decay"]
        verdict = "within 1% of it: a tie" if abs(g / o - 1) < 0.01 else ("beats it" if g < o else "does not beat it")
        print(f"  default ({DEFAULT_POLICY}) {d / lru:.3f}x LRU; gdsf-decay {g / lru:.3f}x LRU, {g / off:.3f}x offline, "
              f"{g / o:.3f}x the oracle ({verdict})")


if __name__ == "__main__":
    main()
