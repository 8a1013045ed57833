"""The core device cache: incremental byte counters, per-key busy/pinned flags, and the plans."""

from __future__ import annotations

import random

from hostd.cache.policy import Share, tenant_usage
from hostd.core.device import DeviceCache


def _check(c: DeviceCache) -> None:
    assert c.used == sum(r.size for r in c.residents.values())
    assert c.tenant_bytes() == {t: n for t, n in tenant_usage(c.residents).items() if n}


def test_counters_equal_the_sums_after_random_operations():
    rng = random.Random(7)
    for policy in ("lru", "gdsf", "gdsf-decay"):
        c = DeviceCache(budget=1000, high=0.9, low=0.6, policy=policy,
                        shares={"a": Share(guaranteed=200), "b": Share(maximum=500)})
        loading: set[str] = set()
        for step in range(3000):
            now = float(step)
            key = f"m{rng.randrange(30)}"
            op = rng.random()
            if key in loading and op < 0.5:
                c.loaded(key, rng.randrange(10, 200), rng.random(), now)  # measured size differs from estimate
                loading.discard(key)
            elif key not in c and op < 0.6:
                plan = c.reserve(key, rng.choice("abc"), rng.randrange(10, 200), now, pinned=rng.random() < 0.05)
                if plan.ok:
                    loading.add(key)
                    for k in plan.evict:
                        assert c.release(k) is not None
                        loading.discard(k)
            elif op < 0.8:
                c.access(key, now)
            elif op < 0.9:
                c.release(key)
                loading.discard(key)
            else:
                c.set_busy(key, rng.random() < 0.5)
                for k in c.watermark_plan(now).evict:
                    c.release(k)
                    loading.discard(k)
            _check(c)


def test_busy_and_pinned_are_set_per_key():
    c = DeviceCache(budget=100, high=1.0, low=1.0)
    for k, now in (("a", 0), ("b", 1)):
        assert c.reserve(k, "t", 50, now).ok
        c.loaded(k, 50, 0.1, now)
    c.set_busy("a", True)
    assert c.reserve("c", "t", 50, 2).evict == ("b",)  # a is busy
    c.release("c")
    c.set_busy("a", False)
    c.set_pinned("a", True)
    assert c.reserve("c", "t", 50, 3).evict == ("b",)  # a is pinned
    c.release("c")
    c.set_pinned("a", False)
    assert c.reserve("c", "t", 50, 4).evict == ("a",)
    c.set_busy("gone", True)  # unknown keys are ignored


def test_reserve_counts_the_estimate_and_loaded_the_measured_size():
    c = DeviceCache(budget=100)
    assert c.reserve("a", "t", 40, 0).ok
    assert c.used == 40 and c.residents["a"].busy
    c.loaded("a", 55, 0.2, 1)
    assert c.used == 55 and c.tenant_bytes() == {"t": 55} and not c.residents["a"].busy
    c.release("a")
    assert c.used == 0 and c.tenant_bytes() == {}
