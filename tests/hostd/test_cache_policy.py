"""Eviction policies on synthetic state: order, busy/pinned, shares, watermarks."""

from __future__ import annotations

import pytest

from hostd.cache.policy import (
    GDSFPolicy,
    LRUPolicy,
    Resident,
    Share,
    bytes_to_free,
    make_policy,
    plan_eviction,
)

MB = 1 << 20


def _state(policy, specs):
    """specs: (key, tenant, size, cost, accesses); accessed in list order, then by access count."""
    residents = {}
    t = 0.0
    for key, tenant, size, cost, accesses in specs:
        residents[key] = Resident(key, tenant, size, last_use=t, load_cost=cost, hits=accesses)
        for _ in range(accesses):
            t += 1.0
            policy.on_access(key, t, size, cost)
            residents[key].last_use = t
    return residents


def test_lru_evicts_least_recently_used_first():
    p = LRUPolicy()
    res = _state(p, [("a", "t", MB, 1.0, 1), ("b", "t", MB, 1.0, 1), ("c", "t", MB, 1.0, 1)])
    p.on_access("a", 10.0, MB, 1.0)  # a becomes most recent
    plan = plan_eviction(p, res, 2 * MB, "t")
    assert plan.ok and plan.evict == ("b", "c") and plan.freed == 2 * MB


def test_lru_sync_rebuilds_order_from_last_use():
    p = LRUPolicy()
    res = {k: Resident(k, "t", MB, last_use=lu) for k, lu in (("x", 5.0), ("y", 1.0), ("z", 3.0))}
    p.sync(res.values())
    assert list(p.victims()) == ["y", "z", "x"]


def test_gdsf_prefers_large_cheap_rarely_used():
    p = GDSFPolicy()
    res = _state(
        p,
        [
            ("big_cheap_rare", "t", 100 * MB, 1.0, 1),
            ("small_costly", "t", 1 * MB, 1.0, 1),
            ("big_hot", "t", 100 * MB, 1.0, 20),
            ("big_costly", "t", 100 * MB, 50.0, 1),
        ],
    )
    assert list(p.victims())[0] == "big_cheap_rare"
    plan = plan_eviction(p, res, 1, "t")
    assert plan.evict == ("big_cheap_rare",)
    # LRU on the same accesses picks the one used longest ago, whatever its size or cost
    lru = LRUPolicy()
    res2 = _state(lru, [("small_costly", "t", MB, 1.0, 1), ("big_cheap_rare", "t", 100 * MB, 1.0, 1)])
    assert plan_eviction(lru, res2, 1, "t").evict == ("small_costly",)


def test_gdsf_clock_inflates_to_evicted_priority():
    p = GDSFPolicy()
    p.on_access("a", 0.0, 10, 1.0)  # priority 0.1
    p.on_access("b", 1.0, 10, 5.0)  # priority 0.5
    p.on_evict("a")
    assert p.clock == pytest.approx(0.1)
    p.on_access("c", 2.0, 10, 1.0)  # priority L + 0.1 = 0.2
    assert p.priority("c") == pytest.approx(0.2)
    assert list(p.victims()) == ["c", "b"]
    p.on_evict("unknown")  # ignored
    assert "a" not in p and len(p) == 2


def test_gdsf_victims_skip_stale_heap_entries_and_compact():
    p = GDSFPolicy()
    for i in range(500):
        p.on_access(i % 5, float(i), 10, 1.0 + (i % 5))
    assert len(p._heap) <= 2 * 5 + 64 + 1
    keys = list(p.victims())
    assert sorted(keys) == [0, 1, 2, 3, 4]
    prios = [p.priority(k) for k in keys]
    assert prios == sorted(prios)


@pytest.mark.parametrize("name", ["lru", "gdsf", "gdsf-decay"])
def test_busy_and_pinned_are_never_chosen(name):
    p = make_policy(name)
    res = _state(p, [("busy", "t", MB, 1.0, 1), ("pinned", "t", MB, 1.0, 1), ("free", "t", MB, 1.0, 1)])
    res["busy"].busy = True
    res["pinned"].pinned = True
    plan = plan_eviction(p, res, MB, "t")
    assert plan.ok and plan.evict == ("free",)
    for shares in (None, {"t": Share(guaranteed=0)}):
        plan = plan_eviction(p, res, 2 * MB, "t", shares)
        assert not plan.ok and plan.evict == () and plan.reason


def test_cannot_free_enough_when_everything_is_busy_or_pinned():
    p = make_policy("lru")
    res = _state(p, [("a", "t", MB, 1.0, 1), ("b", "t", MB, 1.0, 1)])
    res["a"].busy = res["b"].pinned = True
    plan = plan_eviction(p, res, 1, "t")
    assert not plan.ok and plan.evict == () and "busy" in plan.reason
    # watermark eviction (no incoming tenant) is best effort: it lists what it can
    res["b"].pinned = False
    plan = plan_eviction(p, res, 5 * MB, None)
    assert not plan.ok and plan.evict == ("b",) and plan.freed == MB


def test_zero_need_evicts_nothing():
    p = make_policy("gdsf")
    res = _state(p, [("a", "t", MB, 1.0, 1)])
    assert plan_eviction(p, res, 0, "t") == plan_eviction(p, res, 0, "t", {"t": Share()})
    assert plan_eviction(p, res, 0, "t").ok and plan_eviction(p, res, 0, "t").evict == ()


def test_tenant_over_guaranteed_share_is_evicted_first():
    p = LRUPolicy()
    # quiet's models are the least recently used, but quiet is within its guarantee; noisy is over its own
    res = _state(
        p,
        [("q1", "quiet", MB, 1.0, 1), ("q2", "quiet", MB, 1.0, 1)]
        + [(f"n{i}", "noisy", MB, 1.0, 1) for i in range(5)],
    )
    shares = {"quiet": Share(guaranteed=2 * MB), "noisy": Share(guaranteed=2 * MB)}
    plan = plan_eviction(p, res, 2 * MB, "noisy", shares, incoming_bytes=MB)
    assert plan.ok and plan.evict == ("n0", "n1")
    # noisy evicts its own down to its guarantee, and may not touch quiet's guaranteed bytes
    plan = plan_eviction(p, res, 5 * MB, "noisy", shares, incoming_bytes=MB)
    assert not plan.ok and plan.evict == ()
    # without shares, plain LRU would take quiet's models first
    assert plan_eviction(p, res, 2 * MB, "noisy").evict == ("q1", "q2")
    # a tenant within its guarantee may take others' guaranteed bytes once over-share ones are gone
    p2 = LRUPolicy()
    res2 = _state(p2, [("q1", "quiet", MB, 1.0, 1), ("n0", "noisy", 3 * MB, 1.0, 1)])
    plan = plan_eviction(p2, res2, 4 * MB, "third", {"noisy": Share(guaranteed=3 * MB), "third": Share(4 * MB)},
                         incoming_bytes=MB)
    assert plan.ok and set(plan.evict) == {"q1", "n0"}


def test_thousand_models_of_one_tenant_cannot_push_out_others():
    p = LRUPolicy()
    specs = [("a0", "a", 10 * MB, 1.0, 1), ("b0", "b", 10 * MB, 1.0, 1)]
    specs += [(f"n{i}", "noisy", MB, 1.0, 1) for i in range(1000)]
    res = _state(p, specs)
    shares = {"a": Share(guaranteed=10 * MB), "b": Share(guaranteed=10 * MB)}
    for i in range(50):  # noisy keeps loading; every plan takes noisy's own models
        plan = plan_eviction(p, res, MB, "noisy", shares, incoming_bytes=MB)
        assert plan.ok and all(res[k].tenant == "noisy" for k in plan.evict)
        for k in plan.evict:
            del res[k]
            p.on_evict(k)
        key = f"new{i}"
        res[key] = Resident(key, "noisy", MB)
        p.on_access(key, 2000.0 + i, MB, 1.0)
    assert "a0" in res and "b0" in res


def test_max_share_confines_eviction_to_own_models():
    p = LRUPolicy()
    res = _state(p, [("o1", "other", MB, 1.0, 1), ("m1", "capped", MB, 1.0, 1), ("m2", "capped", MB, 1.0, 1)])
    shares = {"capped": Share(maximum=2 * MB)}
    # room on the device is not the issue (need 0), the tenant's maximum is: it evicts its own oldest
    plan = plan_eviction(p, res, 0, "capped", shares, incoming_bytes=MB)
    assert plan.ok and plan.evict == ("m1",)
    # need more than its own models give: cannot, even though "other" could be evicted
    plan = plan_eviction(p, res, 3 * MB, "capped", shares, incoming_bytes=MB)
    assert not plan.ok and plan.evict == () and "maximum" in plan.reason
    res["m1"].busy = res["m2"].busy = True
    assert not plan_eviction(p, res, 0, "capped", shares, incoming_bytes=MB).ok
    assert not plan_eviction(p, res, 0, "capped", shares, incoming_bytes=3 * MB).ok
    # a tenant under its maximum evicts by the usual order
    res["m1"].busy = res["m2"].busy = False
    plan = plan_eviction(p, res, MB, "other", shares, incoming_bytes=MB)
    assert plan.ok and plan.evict == ("o1",)


def test_watermark_arithmetic():
    assert bytes_to_free(used=50, budget=100, high=0.9, low=0.7, incoming=30) == 0  # 80 <= 90
    assert bytes_to_free(used=50, budget=100, high=0.9, low=0.7, incoming=45) == 25  # 95 -> 70
    assert bytes_to_free(used=95, budget=100, high=0.9, low=0.7) == 25  # watermark-driven
    assert bytes_to_free(used=0, budget=100, high=1.0, low=1.0, incoming=150) == 50
    assert bytes_to_free(used=99, budget=100, incoming=2) == 1
    assert bytes_to_free(used=10, budget=100, high=0.8, low=0.333, incoming=80) == 57  # ceil of 56.7
    with pytest.raises(ValueError):
        bytes_to_free(10, 100, high=0.5, low=0.7)


def test_registry():
    assert isinstance(make_policy(), LRUPolicy)
    assert isinstance(make_policy("GDSF"), GDSFPolicy)
    with pytest.raises(ValueError, match="known: lru, gdsf"):
        make_policy("fifo")


def test_policy_module_is_pure():
    import ast
    import pathlib

    import hostd.cache.policy as mod

    tree = ast.parse(pathlib.Path(mod.__file__).read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            names.add((node.module or "").split(".")[0])
    assert not names & {"time", "grpc", "boto3", "redis", "prometheus_client", "asyncio"}
