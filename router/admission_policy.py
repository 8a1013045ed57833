"""Admission at the router's door: per-tenant quotas and deadline feasibility. Pure: the tenant's state,
its quota, the model's recent times and `now` come in; a decision (and the tenant's next state) goes out.
No clock, no I/O, so sim/ and the unit tests drive exactly this code on a virtual clock.

Quotas (each router enforces them on its own traffic):
- rate: a token bucket of `burst` tokens (0 = max(1, rate)) refilled at `rate` tokens/s; a request takes
  one. Empty bucket: refused as QUOTA_RATE, retry after the time until the next token.
- concurrency: at most `max_concurrency` requests in flight. Full: refused as QUOTA_CONCURRENCY, retry after
  about one recent request time of the model (`busy_retry_ms`). Checked before the bucket, so a request
  refused for concurrency does not spend a token.
0 means unlimited for both.

Deadline feasibility: a request whose remaining time cannot cover the model's recent queue + compute time
on the best host that has it READY is refused as DEADLINE_INFEASIBLE, retry after about the queue time.
The queue part counts only where the host reports a queue (the recent queue time is an average that does
not decay while the model is idle). No host has the model READY: no estimate, admitted (hostd bounds a
cold load by the deadline itself).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import Enum


EPS = 1e-9  # float drift in refills must not turn a due token into a refusal


class ShedReason(str, Enum):
    QUOTA_RATE = "quota_rate"
    QUOTA_CONCURRENCY = "quota_concurrency"
    DEADLINE_INFEASIBLE = "deadline_infeasible"


@dataclass(frozen=True)
class Quota:
    rate: float = 0.0  # requests/s; 0 = unlimited
    burst: int = 0  # bucket size; 0 = max(1, rate)
    max_concurrency: int = 0  # requests in flight; 0 = unlimited

    @property
    def capacity(self) -> float:
        return float(self.burst) if self.burst else max(1.0, self.rate)

    @property
    def unlimited(self) -> bool:
        """No rate and no concurrency limit: nothing to admit per request (such a tenant may take the fast lane)."""
        return self.rate <= 0 and self.max_concurrency <= 0


@dataclass(frozen=True)
class TenantState:
    tokens: float | None = None  # None: never seen, the bucket is full
    updated: float = 0.0  # when `tokens` was last brought up to date
    inflight: int = 0


@dataclass(frozen=True)
class Decision:
    admit: bool
    state: TenantState
    reason: ShedReason | None = None
    retry_after_ms: int | None = None
    message: str = ""


def _ceil_ms(seconds: float) -> int:
    return max(1, math.ceil(seconds * 1000 - 1e-9))


def refill(state: TenantState, quota: Quota, now: float) -> TenantState:
    """The bucket brought up to `now` (unchanged when the rate is unlimited)."""
    if quota.rate <= 0:
        return state
    cap = quota.capacity
    if state.tokens is None:
        return replace(state, tokens=cap, updated=now)
    tokens = min(cap, state.tokens + max(0.0, now - state.updated) * quota.rate)
    return replace(state, tokens=tokens, updated=max(now, state.updated))


def admit(state: TenantState, quota: Quota, now: float, *, busy_retry_ms: int = 10) -> Decision:
    """Admit one request (taking a token and a concurrency place) or refuse it, saying why."""
    if quota.max_concurrency and state.inflight >= quota.max_concurrency:
        return Decision(False, state, ShedReason.QUOTA_CONCURRENCY, max(1, busy_retry_ms),
                        f"concurrency quota exceeded: {state.inflight} requests in flight, the limit is "
                        f"{quota.max_concurrency}; retry after {max(1, busy_retry_ms)} ms")
    state = refill(state, quota, now)
    if quota.rate > 0:
        assert state.tokens is not None
        if state.tokens < 1.0 - EPS:
            wait = _ceil_ms((1.0 - state.tokens) / quota.rate)
            return Decision(False, state, ShedReason.QUOTA_RATE, wait,
                            f"rate quota exceeded: {quota.rate:g} requests/s (burst {quota.capacity:g}); "
                            f"retry after {wait} ms")
        state = replace(state, tokens=max(0.0, state.tokens - 1.0))
    return Decision(True, replace(state, inflight=state.inflight + 1))


def release(state: TenantState) -> TenantState:
    """An admitted request finished (answered, failed or cancelled)."""
    return replace(state, inflight=max(0, state.inflight - 1))


@dataclass(frozen=True)
class RecentTimes:
    """One host's recent times for a model it has READY (from its HostStatus)."""

    queue_ms: float
    compute_ms: float
    queue_depth: int = 0

    @property
    def expected_ms(self) -> float:
        return self.compute_ms + (self.queue_ms if self.queue_depth > 0 else 0.0)


@dataclass(frozen=True)
class Feasibility:
    admit: bool
    expected_ms: float | None = None
    retry_after_ms: int | None = None
    message: str = ""
    reason: ShedReason | None = None


def check_deadline(remaining_s: float | None, hosts: Sequence[RecentTimes], model: str = "") -> Feasibility:
    """Can a request with `remaining_s` left finish on the best of `hosts`? None = no deadline."""
    if not hosts:
        return Feasibility(True)
    best = min(hosts, key=lambda h: h.expected_ms)
    need = best.expected_ms
    if remaining_s is None or remaining_s * 1000 >= need:
        return Feasibility(True, need)
    left = max(0.0, remaining_s * 1000)
    queue = best.queue_ms if best.queue_depth > 0 else 0.0
    wait = max(1, math.ceil(queue)) if queue else max(1, math.ceil(need))
    return Feasibility(False, need, wait,
                       f"deadline infeasible: model {model!r} needs about {need:.1f} ms (queue {queue:.1f} + "
                       f"compute {best.compute_ms:.1f}) and the request has {left:.1f} ms left; "
                       f"retry after {wait} ms or with a longer deadline", ShedReason.DEADLINE_INFEASIBLE)
