"""The one deadline rule, shared by router admission, router forwarding and hostd.

A call's deadline is the earliest of its gRPC deadline and its `timeout` request parameter (microseconds,
Triton's semantics); a call with neither gets the server's default timeout, when it has one. Pure: the
caller passes `now` and what it read off the call.
"""

from __future__ import annotations

INF = float("inf")
MAX_TIMEOUT_US = 10**15  # ~31 years: a longer `timeout` parameter means none (and a 500-digit one is no crash)


def deadline_at(now: float, grpc_remaining: float | None, timeout_us: int | None = None,
                default_s: float = 0.0) -> float:
    """Absolute deadline on the caller's clock; INF for none."""
    at = INF if grpc_remaining is None else now + grpc_remaining
    if timeout_us is not None and timeout_us > 0:
        at = min(at, now + min(timeout_us, MAX_TIMEOUT_US) / 1e6)
    if at == INF and default_s > 0:
        at = now + default_s
    return at


def remaining_s(at: float, now: float) -> float | None:
    """Seconds left until `at` (None for no deadline); may be <= 0 when it has passed."""
    return None if at == INF else at - now
