"""What a failed forward means, and whether it may be retried: a small pure policy (statuses in, decision
out). Inference is idempotent, so a request may run again on another host."""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum

import grpc

RETRY_AFTER = "retry-after-ms"
NEVER_RETRY = frozenset({grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
                         grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.DEADLINE_EXCEEDED,
                         grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAUTHENTICATED,
                         grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.FAILED_PRECONDITION})


class Outcome(Enum):
    HOST_DOWN = "host_down"  # transport failure: connection refused, reset, dropped mid-request
    ELSEWHERE = "elsewhere"  # the host answered UNAVAILABLE (draining, no capacity, load failed)
    FINAL = "final"  # the caller gets this status


def retry_after_ms(trailing: Sequence[tuple[str, str | bytes]] | None) -> int | None:
    for k, v in trailing or ():
        if k == RETRY_AFTER:
            try:
                return int(v)
            except (TypeError, ValueError):
                return None
    return None


def classify(code: grpc.StatusCode, details: str, trailing: Sequence[tuple[str, str | bytes]] | None) -> Outcome:
    if code in NEVER_RETRY or code is grpc.StatusCode.OK:
        return Outcome.FINAL
    if code is grpc.StatusCode.UNAVAILABLE:
        # hostd's own UNAVAILABLE always carries retry-after-ms; the transport's never does
        if retry_after_ms(trailing) is None:
            return Outcome.HOST_DOWN
        return Outcome.HOST_DOWN if "draining" in (details or "") else Outcome.ELSEWHERE
    if code in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL) and "RST_STREAM" in (details or ""):
        return Outcome.HOST_DOWN  # stream torn down with the connection
    return Outcome.FINAL


class RetryBudget:
    """Retries are earned: each request adds `ratio` tokens (at most `cap`), each retry spends one. Under a
    broad outage retries stay a bounded fraction of traffic instead of multiplying it."""

    def __init__(self, ratio: float, cap: float) -> None:
        self.ratio, self.cap = ratio, cap
        self.tokens = cap

    def deposit(self) -> None:
        self.tokens = min(self.cap, self.tokens + self.ratio)

    def withdraw(self) -> bool:
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False
