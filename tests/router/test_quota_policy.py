"""Fleet-wide quotas, the pure part (router/quota_policy.py), on a virtual clock: shares, the shared bucket's
arithmetic (what the Lua script computes), leases, and three routers sharing one bucket."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from router.admission_policy import Quota, ShedReason, TenantState
from router.quota_policy import (
    LEASE_TTL_S, Bucket, Lease, admit_leased, granted, lease_size, must_wait, refill_want, share, take_tokens,
)


def test_share_splits_each_limit_and_rounds_up():
    q = Quota(rate=50, burst=5, max_concurrency=4)
    s = share(q, 3)
    assert s.rate == pytest.approx(50 / 3) and s.burst == 2 and s.max_concurrency == 2
    assert share(q, 1) == q and share(q, 0) == q
    assert share(Quota(rate=1), 10).burst == 1  # never below one token
    assert share(Quota(), 5) == Quota()  # unlimited stays unlimited
    assert share(Quota(max_concurrency=1), 3).max_concurrency == 1


def test_lease_is_a_twentieth_of_the_rate_within_one_and_the_burst():
    assert lease_size(Quota(rate=50, burst=5)) == 2
    assert lease_size(Quota(rate=1000, burst=2000)) == 50
    assert lease_size(Quota(rate=1000, burst=10)) == 10
    assert lease_size(Quota(rate=5)) == 1
    assert lease_size(Quota(rate=50, burst=5), rtt_s=0.03) == 3  # two round trips of 30 ms
    assert lease_size(Quota(rate=50, burst=5), rtt_s=0.2) == 5


def test_bucket_grants_the_burst_then_refills_with_time_and_says_when():
    g = take_tokens(None, rate=10, capacity=5, want=3, now=100.0)
    assert (g.granted, g.wait_s) == (3, 0.0)
    g = take_tokens(g.bucket, 10, 5, 3, 100.0)
    assert g.granted == 2 and g.wait_s == pytest.approx(0.3)  # 3 more tokens at 10/s
    g = take_tokens(g.bucket, 10, 5, 3, 100.15)
    assert g.granted == 1 and g.bucket.tokens == pytest.approx(0.5) and g.wait_s == pytest.approx(0.25)
    g = take_tokens(Bucket(0.0, 100.0), 10, 5, 3, 200.0)  # idle long: the bucket is full, not more
    assert g.granted == 3 and g.bucket.tokens == pytest.approx(2.0)
    g = take_tokens(Bucket(1.0, 100.0), 10, 5, 1, 99.0)  # time going back adds nothing
    assert g.granted == 1 and g.bucket.updated == 100.0


def test_lease_refills_at_half_waits_only_when_empty_and_expires():
    q = Quota(rate=100, burst=10)  # lease 5
    lease = Lease()
    assert refill_want(lease, q, 0.0) == 5 and must_wait(lease, q, 0.0)
    lease = granted(lease, 5, 5, 0.0, 0.0, q)
    assert refill_want(lease, q, 0.1) == 0 and not must_wait(lease, q, 0.1)
    lease = Lease(tokens=2, expires=lease.expires)
    assert refill_want(lease, q, 0.1) == 3 and not must_wait(lease, q, 0.1)  # low: top up, admit meanwhile
    assert refill_want(lease, q, LEASE_TTL_S + 0.01) == 5  # unused past the TTL: gone
    empty = granted(Lease(), 5, 0, 0.04, 1.0, q)  # the bucket is empty for 40 ms
    assert refill_want(empty, q, 1.02) == 0 and not must_wait(empty, q, 1.02)
    assert refill_want(empty, q, 1.04) == 5 and must_wait(empty, q, 1.04)
    assert refill_want(Lease(), Quota(), 0.0) == 0 and not must_wait(Lease(), Quota(), 0.0)


def test_admit_leased_takes_a_token_or_refuses_with_the_wait_and_checks_the_concurrency_share():
    q = Quota(rate=50, burst=5, max_concurrency=4)
    d, lease = admit_leased(TenantState(), Lease(tokens=1, expires=10.0), q, 3, 1.0)
    assert d.admit and lease.tokens == 0 and d.state.inflight == 1
    d2, lease2 = admit_leased(d.state, Lease(tokens=0, expires=10.0, retry_at=1.03), q, 3, 1.0)
    assert not d2.admit and d2.reason is ShedReason.QUOTA_RATE and d2.retry_after_ms == 30
    assert d2.state == d.state and lease2.tokens == 0 and "across all routers" in d2.message
    full = TenantState(inflight=2)  # ceil(4 / 3) = 2 per router
    d3, lease3 = admit_leased(full, Lease(tokens=3, expires=10.0), q, 3, 1.0, busy_retry_ms=7)
    assert not d3.admit and d3.reason is ShedReason.QUOTA_CONCURRENCY and d3.retry_after_ms == 7
    assert lease3.tokens == 3  # refused for concurrency: no token spent
    d4, _ = admit_leased(TenantState(), Lease(), Quota(max_concurrency=4), 3, 1.0)
    assert d4.admit  # no rate limit: no lease needed


@dataclass
class SimRouter:
    state: TenantState = field(default_factory=TenantState)
    lease: Lease = field(default_factory=Lease)
    pending: tuple[float, int, int, float] | None = None  # (answer at, want, granted, wait_s)
    admitted: int = 0
    refused: int = 0
    calls: int = 0


@pytest.mark.parametrize("latency_s", [0.0005, 0.005, 0.05, 0.1])
def test_three_routers_sharing_one_bucket_admit_the_rate_in_total(latency_s):
    """Three routers, each offered a request every millisecond for 4 s, with a Redis round trip of
    `latency_s` (leases sized to it): the fleet admits rate x 4 s + the burst, within 10%, every router gets a
    part, and Redis sees a call per admitted token or fewer, not one per request."""
    q = Quota(rate=50, burst=5)
    bucket: Bucket | None = None
    routers = [SimRouter() for _ in range(3)]
    tick, duration = 0.001, 4.0
    for step in range(int(duration / tick)):
        for i, r in enumerate(routers):
            now = step * tick + i * tick / 3
            if r.pending and r.pending[0] <= now:
                _, want, got, wait = r.pending
                r.lease, r.pending = granted(r.lease, want, got, wait, now, q, latency_s), None
            if r.pending is None and (want := refill_want(r.lease, q, now, latency_s)):
                g = take_tokens(bucket, q.rate, q.capacity, want, now + latency_s / 2)  # at Redis
                bucket, r.pending, r.calls = g.bucket, (now + latency_s, want, g.granted, g.wait_s), r.calls + 1
            if r.pending is not None and must_wait(r.lease, q, now):
                continue  # this request waits for the refill (the next tick stands in for it)
            d, r.lease = admit_leased(r.state, r.lease, q, 3, now)
            r.state = r.state if not d.admit else TenantState()
            r.admitted += d.admit
            r.refused += not d.admit
    total = sum(r.admitted for r in routers)
    assert total / duration == pytest.approx(50, rel=0.10), [r.admitted for r in routers]
    assert all(r.admitted > 20 for r in routers), [r.admitted for r in routers]  # every router gets a part
    # Redis is off the per-request path: under 2 calls per admitted token, whatever the 3000 requests/s offered
    assert sum(r.calls for r in routers) < 2 * total
