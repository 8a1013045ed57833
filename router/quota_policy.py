"""Fleet-wide quotas, the pure part: a tenant's rate and concurrency limits hold across all routers together,
not per router (a tenant sold 100 requests/s must not get 100 x N, with N whatever the autoscaler chose).
No clock, no I/O: router/fleet_quota.py (the Redis shell) and the unit tests drive this code with `now`.

Rate: token leases. One token bucket per tenant lives in Redis (`take_tokens` is the arithmetic of the Lua
script in router/fleet_quota.py, which reads Redis's own TIME, so routers' clocks never mix). A router does
not call Redis per request: it takes a *lease* of up to `lease_size` tokens (rate/20: 50 ms of the tenant's
rate, at least 1, at most the burst) and admits from it locally. It asks for more when the lease runs low
(`refill_want`: at most half left), one refill at a time per tenant; only a request that finds the lease empty
waits for that refill (bounded by a short timeout). Short of what it asked for, Redis says when that many
tokens will be there (`Lease.retry_at`), and until then requests are refused locally: refused requests never
reach Redis, which sees about one call per admitted token or fewer, however many requests are offered.

Round trips: the fleet admits at most what the bucket grants, burst + rate x T over any window T (plus the
tokens leased before it, at most N x lease_size). It admits less when the bucket fills to its burst while no
router is asking, and the rest of the rate is lost: routers with small leases, slow round trips (Redis, or
the router's own busy event loop) and a long wait before asking again. So a lease grows to two round trips'
worth of tokens (`rtt_s`, measured by the shell), and a router short of tokens comes back no later than two
round trips before the bucket, emptied, would be full (`granted`). Measured on a virtual clock (3 routers
sharing 50/s, burst 5): 51/s at 0.5 ms round trips, 50/s at 50 ms, 49/s at 100 ms (30/s without these two
rules). A lone router cannot beat burst / round trip: keep round trips well under burst / rate. Leased tokens
unused after `LEASE_TTL_S` are dropped, so a lease taken under old limits or by an idle router does not linger.

Concurrency: per router, at `ceil(max_concurrency / routers)` (`share`), routers being the live routers
seen in Redis. Concurrency is a level, not a flow: holding it exactly across the fleet needs a Redis round
trip when each request starts *and* ends (or slot leases a dead router leaks until they expire), so it is
split instead: the fleet total is the limit (up to N-1 above it from rounding up), while a load balancer
that spreads a tenant's calls unevenly can leave some of the limit unused on a router it favours less.

Redis unreachable or slow: each router falls back to the per-router policy (router/admission_policy.py)
with its `share` of every limit (rate/N, burst/N rounded up, concurrency/N rounded up), N the last count of
live routers it saw, until Redis answers again. Embedded mode (no Redis) keeps the full limits per router.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from router.admission_policy import EPS, Decision, Quota, ShedReason, TenantState, admit

LEASE_FRACTION = 20.0  # a lease is rate/20 tokens: 50 ms of the tenant's rate
LEASE_TTL_S = 1.0  # leased tokens unused this long after the grant are dropped


def share(quota: Quota, routers: int) -> Quota:
    """One router's part of `quota` when `routers` routers share it (the fallback, and concurrency always)."""
    n = max(1, routers)
    if n == 1:
        return quota
    return Quota(rate=quota.rate / n,
                 burst=max(1, math.ceil(quota.capacity / n - EPS)) if quota.rate > 0 else 0,
                 max_concurrency=max(1, math.ceil(quota.max_concurrency / n - EPS)) if quota.max_concurrency else 0)


def lease_size(quota: Quota, rtt_s: float = 0.0) -> int:
    """Tokens a router takes from the fleet's bucket at once: rate/20, or the tokens of two round trips to
    Redis when those take longer, at least 1, at most the burst."""
    return max(1, min(int(quota.capacity), int(quota.rate * max(1.0 / LEASE_FRACTION, 2.0 * rtt_s))))


# -- the fleet's bucket (what the Lua script computes, in Redis) -------------------------------------------


@dataclass(frozen=True)
class Bucket:
    tokens: float
    updated: float


@dataclass(frozen=True)
class Grant:
    granted: int
    wait_s: float  # 0 when all asked for was granted, else the time until that many will be there
    bucket: Bucket


def take_tokens(bucket: Bucket | None, rate: float, capacity: float, want: int, now: float) -> Grant:
    """Refill the bucket by the time elapsed, then grant up to `want` whole tokens."""
    if bucket is None:
        bucket = Bucket(capacity, now)
    tokens = min(capacity, bucket.tokens + max(0.0, now - bucket.updated) * rate)
    granted = max(0, min(want, math.floor(tokens + EPS)))
    tokens = max(0.0, tokens - granted)
    wait = (min(want, capacity) - tokens) / rate if granted < want else 0.0
    return Grant(granted, max(0.0, wait), Bucket(tokens, max(now, bucket.updated)))


# -- a router's lease ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Lease:
    tokens: int = 0
    expires: float = 0.0  # tokens still held past this are dropped
    retry_at: float = 0.0  # the fleet's bucket said: no tokens before this


def live_tokens(lease: Lease, now: float) -> int:
    return lease.tokens if now < lease.expires else 0


def refill_want(lease: Lease, quota: Quota, now: float, rtt_s: float = 0.0) -> int:
    """Tokens to ask the fleet's bucket for now: 0 when the lease holds more than half a lease, or the
    bucket said it is empty until later. `rtt_s`: the recent round trip to Redis, as the router sees it."""
    size = lease_size(quota, rtt_s)
    have = live_tokens(lease, now)
    if quota.rate <= 0 or have * 2 > size or now < lease.retry_at:
        return 0
    return size - have


def must_wait(lease: Lease, quota: Quota, now: float) -> bool:
    """A request finds the lease empty and the fleet's bucket may have tokens: it waits for the refill."""
    return quota.rate > 0 and live_tokens(lease, now) == 0 and now >= lease.retry_at


def granted(lease: Lease, want: int, got: int, wait_s: float, now: float, quota: Quota,
            rtt_s: float = 0.0) -> Lease:
    """The lease after the fleet's bucket granted `got` of `want` tokens at `now`. Short of `want`, the router
    asks again when the bucket will have `want` (`wait_s`), but no later than two round trips before the
    bucket, emptied now, fills to its burst: a router coming back late finds tokens lost to the cap."""
    if got >= want or quota.rate <= 0:
        retry_at = 0.0
    else:
        retry_at = now + min(wait_s, max(0.0, quota.capacity / quota.rate - 2.0 * rtt_s))
    return Lease(tokens=live_tokens(lease, now) + got, expires=now + LEASE_TTL_S, retry_at=retry_at)


def admit_leased(state: TenantState, lease: Lease, quota: Quota, routers: int, now: float, *,
                 busy_retry_ms: int = 10) -> tuple[Decision, Lease]:
    """Admit one request in fleet mode: concurrency against this router's share, then a token of the lease."""
    d = admit(state, Quota(max_concurrency=share(quota, routers).max_concurrency), now, busy_retry_ms=busy_retry_ms)
    if not d.admit or quota.rate <= 0:
        return d, lease
    have = live_tokens(lease, now)
    if have >= 1:
        return d, replace(lease, tokens=have - 1)
    wait_s = lease.retry_at - now if lease.retry_at > now else 1.0 / quota.rate
    wait = max(1, math.ceil(wait_s * 1000 - 1e-9))
    return Decision(False, state, ShedReason.QUOTA_RATE, wait,
                    f"rate quota exceeded: {quota.rate:g} requests/s across all routers (burst "
                    f"{quota.capacity:g}); retry after {wait} ms"), lease
