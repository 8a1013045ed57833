"""The router's admission policy on a virtual clock: token bucket, concurrency limit, deadline feasibility."""

from __future__ import annotations

from router.admission import Admission
from router.admission_policy import (
    Quota, RecentTimes, ShedReason, TenantState, admit, check_deadline, release,
)
from ground.tenancy import limits_for


def run(quota: Quota, times: list[float], state: TenantState | None = None) -> tuple[list, TenantState]:
    """Admit at each time (releasing at once), returning the decisions."""
    st = state or TenantState()
    out = []
    for t in times:
        d = admit(st, quota, t)
        out.append(d)
        st = release(d.state) if d.admit else d.state
    return out, st


def test_a_full_bucket_admits_a_burst_then_refuses_with_the_time_until_the_next_token():
    q = Quota(rate=10, burst=5)
    ds, _ = run(q, [0.0] * 7)
    assert [d.admit for d in ds] == [True] * 5 + [False, False]
    refused = ds[5]
    assert refused.reason is ShedReason.QUOTA_RATE and refused.retry_after_ms == 100  # 1 token at 10/s
    assert "rate quota" in refused.message and "10 requests/s" in refused.message


def test_the_bucket_refills_at_the_rate_and_retry_after_is_honest():
    q = Quota(rate=10, burst=1)
    d1 = admit(TenantState(), q, 100.0)
    st = release(d1.state)
    d2 = admit(st, q, 100.03)  # 0.3 token: 70 ms to go
    assert not d2.admit and d2.retry_after_ms == 70
    d3 = admit(d2.state, q, 100.03 + d2.retry_after_ms / 1000)
    assert d3.admit


def test_sustained_rate_is_the_quota():
    q = Quota(rate=20, burst=1)
    ticks = [i * 0.001 for i in range(10_000)]  # 10 s of a client sending 1000 requests/s
    ds, _ = run(q, ticks)
    admitted = sum(d.admit for d in ds)
    assert 199 <= admitted <= 201  # burst + 20/s for 10 s


def test_burst_zero_means_max_one_rate():
    assert Quota(rate=5).capacity == 5 and Quota(rate=0.5).capacity == 1


def test_concurrency_limit_refuses_without_spending_a_token_and_frees_on_release():
    q = Quota(rate=100, burst=3, max_concurrency=2)
    st = TenantState()
    a = admit(st, q, 0.0)
    b = admit(a.state, q, 0.0)
    c = admit(b.state, q, 0.0, busy_retry_ms=25)
    assert a.admit and b.admit and not c.admit
    assert c.reason is ShedReason.QUOTA_CONCURRENCY and c.retry_after_ms == 25 and "concurrency quota" in c.message
    assert c.state.tokens == b.state.tokens == 1.0  # the refused request took no token
    d = admit(release(c.state), q, 0.0)
    assert d.admit and d.state.inflight == 2


def test_unlimited_quota_admits_everything():
    ds, st = run(Quota(), [0.0] * 1000)
    assert all(d.admit for d in ds) and st.inflight == 0


def test_admission_holder_uses_registry_limits_and_default_unlimited():
    adm = Admission({"free": limits_for("free", {"rate": 1, "burst": 1, "max_concurrency": 0})})
    assert adm.enter("free", 0.0).admit
    d = adm.enter("free", 0.0)
    assert not d.admit and d.reason is ShedReason.QUOTA_RATE and d.retry_after_ms == 1000
    assert all(adm.enter("other", 0.0).admit for _ in range(100))  # not in the registry: unlimited
    assert adm.inflight("other") == 100
    adm.leave("other")
    assert adm.inflight("other") == 99
    adm.replace({"free": limits_for("free", {"rate": 1000, "burst": 10})})  # new limits, bucket carries over
    assert adm.enter("free", 0.5).admit


def test_deadline_feasibility_uses_the_best_host_and_counts_the_queue_only_where_one_is_reported():
    busy = RecentTimes(queue_ms=80, compute_ms=20, queue_depth=5)
    idle_stale = RecentTimes(queue_ms=500, compute_ms=20, queue_depth=0)  # old queue time, nothing queued now
    assert check_deadline(0.05, [busy]).admit is False
    f = check_deadline(0.05, [busy], "slow")
    assert f.reason is ShedReason.DEADLINE_INFEASIBLE and f.retry_after_ms == 80 and "'slow'" in f.message
    assert f.expected_ms == 100
    assert check_deadline(0.05, [busy, idle_stale]).admit  # the idle host can do it in 20 ms
    assert check_deadline(0.1, [busy]).admit
    assert check_deadline(None, [busy]).admit  # no deadline
    assert check_deadline(0.001, []).admit  # nothing known: hostd bounds a cold load itself
    g = check_deadline(0.005, [RecentTimes(0, 20, 0)])
    assert not g.admit and g.retry_after_ms == 20  # compute alone does not fit
