"""Fleet-wide quotas, the Redis shell around router/quota_policy.py (the design is argued there): each
tenant's token bucket in Redis, taken from in leases by one Lua script; the live routers, counted in a Redis
sorted set each router heartbeats into; and the mode this router is in: "fleet" (leases) or "local" (Redis
unreachable or slow: each limit's share, limit / routers seen), in the gauge
`mmhost_router_quota_mode{mode}` and a log line on each switch.

The Redis client, the clock and the gauge are passed in (router/server.py wires them); nothing here starts a
task of its own except the one refill in flight per tenant, which a request started.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from router.admission_policy import Quota
from router.quota_policy import Lease, granted, must_wait, refill_want

log = logging.getLogger(__name__)

FLEET, LOCAL = "fleet", "local"

# KEYS[1]: the tenant's bucket; ARGV: rate, capacity, want -> {granted, wait_s}. Mirrors
# quota_policy.take_tokens; the time is Redis's, so routers' clocks never mix. An idle bucket expires (full).
TAKE = """
local rate = tonumber(ARGV[1])
local cap = tonumber(ARGV[2])
local want = tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local b = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(b[1])
local ts = tonumber(b[2])
if tokens == nil or ts == nil then tokens = cap; ts = now end
tokens = math.min(cap, tokens + math.max(0, now - ts) * rate)
local grant = math.max(0, math.min(want, math.floor(tokens + 1e-9)))
tokens = math.max(0, tokens - grant)
local wait = 0
if grant < want then wait = (math.min(want, cap) - tokens) / rate end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'ts', tostring(math.max(now, ts)))
redis.call('PEXPIRE', KEYS[1], math.ceil(cap / rate * 1000) + 1000)
return {grant, tostring(wait)}
"""

# KEYS[1]: the routers' set; ARGV: this router's id, ttl_s -> live routers. Scores are Redis's TIME.
HEARTBEAT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[2]))
redis.call('PEXPIRE', KEYS[1], math.ceil(tonumber(ARGV[2]) * 1000))
return redis.call('ZCARD', KEYS[1])
"""


class FleetQuota:
    def __init__(self, redis, prefix: str, router_id: str, clock: Callable[[], float], mode_gauge, *,
                 timeout_s: float = 0.25, router_ttl_s: float = 3.0) -> None:
        """`redis`: an asyncio client whose socket timeout is about `timeout_s`; `mode_gauge`: a Gauge with
        a `mode` label."""
        self._r, self._prefix, self._id, self._clock, self._gauge = redis, prefix, router_id, clock, mode_gauge
        self._timeout, self._ttl = timeout_s, router_ttl_s
        self._take = redis.register_script(TAKE)
        self._beat = redis.register_script(HEARTBEAT)
        self.routers = 1  # live routers last seen (1 until Redis has said)
        self.rtt_s = 0.0  # recent round trip of a lease call (moving average), which sizes leases
        self.leases: dict[str, Lease] = {}
        self._refills: dict[str, asyncio.Task] = {}
        self.mode = ""
        self._switch(FLEET, "")

    def _switch(self, mode: str, why: str) -> None:
        if mode == self.mode:
            return
        if self.mode:
            if mode == LOCAL:
                log.warning("fleet quotas: Redis unreachable or slow (%s); each limit is now this router's share, "
                            "limit / %d routers", why, self.routers)
            else:
                log.info("fleet quotas: Redis answers again; limits hold across the fleet (%d routers)", self.routers)
        self.mode = mode
        self.leases.clear()  # leases from before a switch are not trusted
        for m in (FLEET, LOCAL):
            self._gauge.labels(m).set(1 if m == mode else 0)

    def lease(self, tenant: str) -> Lease:
        return self.leases.get(tenant, Lease())

    async def heartbeat(self) -> None:
        """Register this router, count the live ones; a failure switches to local, a success back to fleet."""
        try:
            n = await asyncio.wait_for(self._beat(keys=[self._prefix + "routers"], args=[self._id, self._ttl]),
                                       self._timeout * 4)
        except Exception as e:  # noqa: BLE001 - Redis down or slow: local shares, and say so once
            self._switch(LOCAL, f"heartbeat: {e or type(e).__name__}")
            return
        self.routers = max(1, int(n))
        self._switch(FLEET, "")

    async def leave(self) -> None:
        """On shutdown: this router no longer counts."""
        try:
            await asyncio.wait_for(self._r.zrem(self._prefix + "routers", self._id), self._timeout * 4)
        except Exception as e:  # noqa: BLE001 - it drops out with its TTL anyway
            log.info("fleet quotas: could not deregister (%s)", e)

    async def ready(self, tenant: str, quota: Quota) -> None:
        """Before admission: top the tenant's lease up when it runs low (one refill at a time), and wait for
        that refill (at most the timeout) only when the lease is empty and the bucket may have tokens."""
        if self.mode != FLEET or quota.rate <= 0:
            return
        now = self._clock()
        lease = self.lease(tenant)
        task = self._refills.get(tenant)
        if task is None:
            want = refill_want(lease, quota, now, self.rtt_s)
            if not want:
                return
            task = asyncio.get_running_loop().create_task(self._refill(tenant, quota, want))
            self._refills[tenant] = task
        if must_wait(lease, quota, now):
            try:
                await asyncio.wait_for(asyncio.shield(task), self._timeout * 2)
            except asyncio.TimeoutError:
                pass  # decided on what is known; the refill itself switches to local if Redis stays silent

    async def _refill(self, tenant: str, quota: Quota, want: int) -> None:
        t0 = self._clock()
        try:
            res = await asyncio.wait_for(
                self._take(keys=[f"{self._prefix}bucket:{tenant}"], args=[quota.rate, quota.capacity, want]),
                self._timeout)
            got, wait_s = int(res[0]), float(res[1])
        except Exception as e:  # noqa: BLE001 - Redis down or slow: local shares until a heartbeat answers
            self._switch(LOCAL, f"lease: {e or type(e).__name__}")
            return
        finally:
            self._refills.pop(tenant, None)
        now = self._clock()
        self.rtt_s += (now - t0 - self.rtt_s) / 8
        if self.mode == FLEET:
            self.leases[tenant] = granted(self.lease(tenant), want, got, wait_s, now, quota, self.rtt_s)
