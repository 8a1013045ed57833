"""The byte budget for requests in flight (ground/inflight_policy.py), as pure code: per-tenant and total
bounds, the retry hint, a request bigger than a whole bound, release, and budgets read from settings."""

from __future__ import annotations

import pytest

from ground.inflight_policy import ByteBudget, InflightBytes, budget_of

MB = 1 << 20


def test_a_tenant_is_held_to_its_bound_while_others_keep_room():
    b = InflightBytes(ByteBudget(total=100 * MB, per_tenant=25 * MB))
    assert all(b.acquire("a", 8 * MB).granted for _ in range(3))
    refused = b.acquire("a", 8 * MB)
    assert not refused.granted and refused.retry_after_ms >= 20 and "tenant" in refused.message
    assert b.of("a") == 24 * MB and b.total == 24 * MB  # a refusal holds nothing
    assert b.acquire("b", 1 * MB).granted and b.acquire("c", 25 * MB).granted
    b.release("a", 8 * MB)
    assert b.acquire("a", 8 * MB).granted


def test_the_total_bounds_all_tenants_together():
    b = InflightBytes(ByteBudget(total=40 * MB, per_tenant=20 * MB))
    assert b.acquire("a", 20 * MB).granted and b.acquire("b", 20 * MB).granted
    r = b.acquire("c", 1)
    assert not r.granted and "server" in r.message
    b.release("b", 20 * MB)
    assert b.acquire("c", 1).granted


def test_the_retry_hint_is_the_time_the_bytes_in_flight_take_to_drain_capped():
    budget = ByteBudget(total=0, per_tenant=64 * MB, drain_bytes_per_s=256 * MB, min_retry_ms=20, max_retry_ms=2000)
    b = InflightBytes(budget)
    assert b.acquire("a", 1 * MB).granted
    assert b.acquire("a", 64 * MB).retry_after_ms == 20  # 1 MiB drains in 4 ms: the floor
    assert b.acquire("a", 63 * MB).granted
    assert b.acquire("a", 1).retry_after_ms == 250  # 64 MiB at 256 MiB/s
    slow = InflightBytes(ByteBudget(total=0, per_tenant=64 * MB, drain_bytes_per_s=1 * MB))
    slow.acquire("a", 64 * MB)
    assert slow.acquire("a", 1).retry_after_ms == 2000  # the cap


def test_a_request_bigger_than_the_tenant_bound_runs_alone_never_refused_forever():
    b = InflightBytes(ByteBudget(total=100 * MB, per_tenant=10 * MB))
    assert b.acquire("a", 30 * MB).granted  # nothing else of a's in flight
    assert not b.acquire("a", 1).granted
    b.release("a", 30 * MB)
    assert b.acquire("a", 1).granted and not b.acquire("a", 30 * MB).granted


def test_release_returns_exactly_and_forgets_idle_tenants():
    b = InflightBytes(ByteBudget(total=10 * MB, per_tenant=10 * MB))
    for t in ("a", "b", "c"):
        b.acquire(t, 100)
    for t in ("a", "b", "c"):
        b.release(t, 100)
    assert b.total == 0 and b.tenants() == 0


def test_zero_turns_a_bound_off():
    b = InflightBytes(budget_of("0", "0"))
    assert all(b.acquire("a", 1 << 30).granted for _ in range(10))


def test_budgets_from_settings():
    assert budget_of("256MiB") == ByteBudget(total=256 * MB, per_tenant=64 * MB)
    assert budget_of("0.5", "0.1", "2GiB") == ByteBudget(total=1024 * MB, per_tenant=int(0.1 * 2048 * MB))
    assert budget_of("1GiB", "100MiB").per_tenant == 100 * MB
    with pytest.raises(ValueError):
        budget_of("0.5")  # a fraction of nothing


def test_the_expected_body_follows_a_larger_one_at_once_and_a_smaller_one_slowly():
    b = InflightBytes(ByteBudget(total=0, per_tenant=64 * MB))
    assert b.expected("a") == 1  # nothing seen yet: "is there room at all"
    b.observe("a", 8 * MB)
    assert b.expected("a") == 8 * MB
    b.observe("a", 1000)
    assert 7 * MB < b.expected("a") < 8 * MB  # one small body does not make a large-body tenant cheap
    for _ in range(200):
        b.observe("a", 1000)
    assert b.expected("a") < 2000 and b.expected("b") == 1
    # a large-body tenant: arrivals reserve what bodies hold, so at most bound / size arrive at once
    b.observe("big", 8 * MB)
    held = [b.acquire("big", b.expected("big")).granted for _ in range(12)]
    assert held.count(True) == 8
