"""gdsf-decay (hostd/cache/policy.py) on synthetic access sequences, pure: no clock, no I/O. Its value is
frequency x load cost / size, the frequency decaying by half every half-life of requests and kept for models
that were evicted."""

from __future__ import annotations

import pytest

from hostd.cache.policy import DecayedGDSFPolicy, Resident, make_policy, plan_eviction
from hostd.core.device import DeviceCache

MB = 1 << 20


def _policy(**kw) -> DecayedGDSFPolicy:
    return DecayedGDSFPolicy(**{"min_half_life": 100, "half_life_per_resident": 0, **kw})


def test_the_value_is_frequency_times_cost_per_byte():
    p = _policy()
    for _ in range(3):
        p.on_access("popular", 0.0, MB, 1.0)
    p.on_access("once", 0.0, MB, 1.0)
    p.on_access("cheap-and-big", 0.0, 4 * MB, 1.0)
    p.on_access("costly", 0.0, MB, 8.0)
    assert list(p.victims()) == ["cheap-and-big", "once", "popular", "costly"]


def test_frequency_outlives_an_eviction():
    p = _policy()
    for _ in range(5):
        p.on_access("popular", 0.0, MB, 1.0)
    p.on_evict("popular")
    assert "popular" not in p and list(p.victims()) == []
    p.on_access("cold", 0.0, MB, 1.0)
    p.on_access("popular", 0.0, MB, 1.0)  # loaded again: comes back with its history (about 6), not 1
    assert list(p.victims()) == ["cold", "popular"] and p.count("popular") > 5.5
    plain = make_policy("gdsf")  # plain GDSF restarts at 1: the popular model is the next victim
    for k in ("cold", "popular"):
        plain.on_access(k, 0.0, MB, 1.0)
    assert list(plain.victims())[0] == "cold"  # a tie, broken by recency; its frequency is 1 again
    assert plain.priority("popular") == plain.priority("cold")


def test_counts_halve_every_half_life_and_faded_history_is_forgotten():
    p = _policy(min_half_life=10)
    for _ in range(4):
        p.on_access("old", 0.0, MB, 1.0)
    p.on_evict("old")
    for i in range(10):
        p.on_access(f"new{i % 2}", 0.0, MB, 1.0)
    at_eviction = sum(0.5 ** (j / 10) for j in range(4))  # four requests, one request apart: 3.63
    assert p.count("old") == pytest.approx(at_eviction * 0.5, rel=1e-9)  # one half-life later
    for i in range(60):
        p.on_access(f"new{i % 2}", 0.0, MB, 1.0)
    assert "old" not in p.history  # 3.63 x 2^-6.6 < forget_below (0.05): dropped at the sweep at t=70
    assert set(p.history) == {"new0", "new1"}


def test_an_old_favourite_gives_way_to_the_new_one():
    p = _policy(min_half_life=20)
    for _ in range(20):
        p.on_access("old", 0.0, MB, 1.0)  # 20 requests long ago
    for _ in range(60):
        p.on_access("new", 0.0, MB, 1.0)  # then only the new one: three half-lives
    assert p.count("old") < p.count("new") and list(p.victims()) == ["old", "new"]


def test_a_sweep_fixes_the_half_life_from_the_residents_and_keeps_their_order():
    p = DecayedGDSFPolicy(min_half_life=8, half_life_per_resident=4)
    for i, n in enumerate((1, 3, 2, 5)):
        for _ in range(n):
            p.on_access(f"m{i}", 0.0, MB * (i + 1), 1.0)
    before = list(p.victims())
    assert p.half_life == 16.0  # 4 residents x 4, fixed at the sweep after 8 requests
    for _ in range(16):  # another sweep, on the busiest resident only
        p.on_access("m3", 0.0, 4 * MB, 1.0)
    assert list(p.victims()) == before and p.half_life == 16.0


def test_a_scan_of_cold_models_does_not_flush_the_popular_ones():
    """Through the host core's device cache: 4 popular models, then a noisy tenant's scan of 40 cold ones,
    one request each; the cache holds 6 models. LRU ends with none of the popular ones; gdsf-decay keeps
    them all (each new cold model is the next victim)."""
    def run(policy: str) -> set[str]:
        cache = DeviceCache(6 * MB, policy=policy)
        t = 0.0
        for key in [f"hot{i % 4}" for i in range(40)] + [f"cold{i}" for i in range(40)]:
            t += 1.0
            if cache.access(key, t):
                continue
            plan = cache.reserve(key, "noisy" if key.startswith("cold") else "t", MB, t)
            assert plan.ok
            for k in plan.evict:
                cache.release(k)
            cache.loaded(key, MB, 1.0, t)
        return {k for k in cache.residents if str(k).startswith("hot")}

    assert run("lru") == set()
    assert run("gdsf-decay") == {"hot0", "hot1", "hot2", "hot3"}


def test_sync_rebuilds_from_the_records():
    p = _policy()
    res = {"a": Resident("a", "t", MB, last_use=1.0, load_cost=1.0, hits=5),
           "b": Resident("b", "t", MB, last_use=2.0, load_cost=1.0, hits=1)}
    p.sync(res.values())
    assert list(p.victims()) == ["b", "a"] and len(p) == 2
    plan = plan_eviction(p, res, MB, "t")
    assert plan.ok and plan.evict == ("b",)
