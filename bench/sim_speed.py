"""Simulator speed: cache-only requests per minute on one core (target >= 1M), measured in one run.

    .venv/bin/python bench/sim_speed.py [--requests 1000000] [--models 1000]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sim.cache_only import run_cache_only  # noqa: E402
from sim.offline import run_offline  # noqa: E402
from sim.workload import SyntheticConfig, generate  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--models", type=int, default=1000)
    ap.add_argument("--cache-fraction", type=float, default=0.1)
    a = ap.parse_args()
    t0 = time.perf_counter()
    wl = generate(SyntheticConfig(models=a.models, requests=a.requests, zipf=0.9, seed=0))
    print(f"workload: {len(wl):,} requests, {a.models} models, generated in {time.perf_counter() - t0:.2f} s")
    budget = int(wl.total_bytes * a.cache_fraction)
    for name, fn in (("lru", lambda: run_cache_only(wl, budget, "lru")),
                     ("gdsf", lambda: run_cache_only(wl, budget, "gdsf")),
                     ("offline", lambda: run_offline(wl, budget))):
        t = time.perf_counter()
        r = fn()
        dt = time.perf_counter() - t
        print(f"{name:8s} {len(wl) / dt * 60 / 1e6:6.2f} M requests/minute  ({dt:.2f} s, hit rate "
              f"{r.row()['hit_rate']:.3f})  target >= 1 M/min: {'ok' if len(wl) / dt * 60 >= 1e6 else 'MISSED'}")


if __name__ == "__main__":
    main()
