"""A budget of request bytes in flight, per tenant and per process: a small pure policy (no clock, no I/O),
used by the router (the body of each ModelInfer, from arrival until its answer is back) and by hostd (each
request's size, for the whole of DataPlane.infer).

Why: memory, not request counts, is what one tenant's storm of large requests takes from everyone else (64
concurrent 8 MB requests took a router from 66 MB to 2 GB, its pod limit). A request that would take its
tenant past `per_tenant`, or the process past `total`, is refused at once with RESOURCE_EXHAUSTED, reason
`inflight_bytes` and a retry hint, so its bytes are dropped instead of held. The tenant bound is a fraction of
the total (a quarter by default), so one tenant never fills the process and other tenants keep room.

- `acquire(tenant, n)` -> Grant (granted, or refused with `retry_after_ms` and a message); a grant must be
  given back with `release(tenant, n)` exactly once.
- A request larger than the tenant's whole bound can never fit beside anything: it is granted only while its
  tenant has nothing else in flight (and the process total has room for it), so a big request is slow under
  load, never refused forever; the same holds for a request larger than the process total while nothing
  at all is in flight. (The transport's message limit, max_message_bytes / max_request_bytes, still
  bounds the size of any one request.)
- The retry hint is the time the bytes already in flight under the refusing bound take to drain at
  `drain_bytes_per_s` (between `min_retry_ms` and `max_retry_ms`): a tenant with 64 MiB in flight is told
  ~250 ms, so a client that honours it stops resending bodies that cannot fit yet (each resend costs the
  server its receipt). It is a hint; the caller's client decides.
- A bound of 0 turns that bound off.
- A server that can act before a body arrives (the router's ModelInfer) first acquires `expected(tenant)`
  for the call, reads the body, gives that back, `observe`s the body's size and acquires it. `expected` is
  the size of the tenant's recent bodies (it follows a larger body at once and a smaller one slowly; 1 byte
  before any): a tenant whose bound is full is refused before its next body is received at all, a tenant of
  large bodies has at most bound / body size of them arriving at once, and a burst of small requests costs
  next to nothing and is never refused for it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ground.units import parse_bytes


@dataclass(frozen=True, slots=True)
class ByteBudget:
    total: int  # bytes in flight in the whole process; 0 = unbounded
    per_tenant: int  # bytes in flight of one tenant; 0 = unbounded
    drain_bytes_per_s: float = 256e6  # how fast bytes in flight are assumed to leave (for the retry hint)
    min_retry_ms: int = 20
    max_retry_ms: int = 2000


def budget_of(total: str | int, per_tenant: str | int = "", memory_limit: str | int = "") -> ByteBudget:
    """A budget from settings: sizes in bytes ('512MiB') or fractions of `memory_limit` ('0.25'); an empty
    `per_tenant` is a quarter of the total; 0 turns a bound off. ValueError on what cannot be read."""
    limit = parse_bytes(memory_limit) if memory_limit not in ("", None) else None
    t = parse_bytes(total, limit)
    pt = parse_bytes(per_tenant, limit) if per_tenant not in ("", None) else t // 4
    return ByteBudget(total=max(0, t), per_tenant=max(0, pt))


@dataclass(frozen=True, slots=True)
class Grant:
    granted: bool
    retry_after_ms: int = 0
    message: str = ""


GRANTED = Grant(True)


class InflightBytes:
    """Bytes in flight per tenant and in total, against a ByteBudget."""

    def __init__(self, budget: ByteBudget) -> None:
        self.budget = budget
        self.total = 0
        self._by_tenant: dict[str, int] = {}
        self._expected: dict[str, int] = {}  # tenant -> recent body size (one int per tenant that sent any)

    def expected(self, tenant: str) -> int:
        """What a body of `tenant`'s that has not arrived yet is expected to hold (1 before any was seen)."""
        return self._expected.get(tenant, 1)

    def observe(self, tenant: str, n: int) -> None:
        """A body of `n` bytes arrived: up to it at once, down towards it by an eighth of the gap."""
        e = self._expected.get(tenant, 0)
        self._expected[tenant] = max(1, n if n >= e else e - (e - n) // 8)

    def of(self, tenant: str) -> int:
        return self._by_tenant.get(tenant, 0)

    def tenants(self) -> int:
        """How many tenants have bytes in flight (the map holds no others)."""
        return len(self._by_tenant)

    def acquire(self, tenant: str, n: int) -> Grant:
        b = self.budget
        n = max(0, n)
        mine = self._by_tenant.get(tenant, 0)
        held = 0  # bytes in flight under the bound that refuses: about what must drain before this fits
        who = ""
        if b.per_tenant and mine + n > b.per_tenant and mine > 0:
            held, who = mine, f"the tenant's bound of {b.per_tenant} bytes"
        elif b.total and self.total + n > b.total and not (self.total == 0 and mine == 0):
            held, who = self.total, f"this server's bound of {b.total} bytes"
        if who:
            ms = int(held * 1000 / b.drain_bytes_per_s) if b.drain_bytes_per_s > 0 else b.max_retry_ms
            return Grant(False, min(b.max_retry_ms, max(b.min_retry_ms, ms)),
                         f"too many request bytes in flight: {n} more would pass {who}; retry later")
        self._by_tenant[tenant] = mine + n
        self.total += n
        return GRANTED

    def release(self, tenant: str, n: int) -> None:
        n = max(0, n)
        left = self._by_tenant.get(tenant, 0) - n
        if left > 0:
            self._by_tenant[tenant] = left
        else:
            self._by_tenant.pop(tenant, None)
        self.total = max(0, self.total - n)
