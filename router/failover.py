"""What a failed forward means, and whether it may be retried: a small pure policy (status code and the
`mmhost-reason` trailer in, decision out; never the words of a message). Inference is idempotent, so a
request may run again on another host.

- No `mmhost-reason` on an error status: no mmhost process answered, the transport failed (refused, reset,
  torn down mid-stream): the host is down, try another.
- `draining`: the hostd says it is leaving: mark it down, try another.
- A reason that belongs to this host's state for one model (no capacity, unloading, queue
  full): try another host, the host stays up.
- Everything else (the caller's mistake, a shed that holds everywhere, a model's own failure): final.
  A model's failure to load is that model's error, never the host's (`load_failed`); storage that is down is down
  for every host (`storage_down`), so it goes straight back to the caller.

Pure (no grpc import): a status code is read by its name, so grpc.StatusCode members and anything else with
the same names will do."""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from typing import Protocol

from ground.wire import HOST_LEAVING, TRY_ELSEWHERE, reason_of, retry_after_ms

# status code names (grpc.StatusCode member names)
NEVER_RETRY = frozenset({"INVALID_ARGUMENT", "NOT_FOUND", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED", "CANCELLED",
                         "UNAUTHENTICATED", "PERMISSION_DENIED", "FAILED_PRECONDITION"})
# what a failed transport reports when no mmhost process answered (refused, reset, torn down)
TRANSPORT_FAILURE = frozenset({"UNAVAILABLE", "UNKNOWN", "INTERNAL"})


class StatusCode(Protocol):
    """A gRPC status code, e.g. a grpc.StatusCode member."""

    @property
    def name(self) -> str: ...


class Outcome(Enum):
    HOST_DOWN = "host_down"  # transport failure: connection refused, reset, dropped mid-request
    ELSEWHERE = "elsewhere"  # the host answered UNAVAILABLE (draining, no capacity, load failed)
    FINAL = "final"  # the caller gets this status


def classify(code: StatusCode, trailing: Sequence[tuple[str, str | bytes]] | None) -> Outcome:
    if code.name == "OK":
        return Outcome.FINAL
    reason = reason_of(trailing)
    if reason is None:  # no mmhost process answered: the transport failed
        return Outcome.HOST_DOWN if code.name in TRANSPORT_FAILURE else Outcome.FINAL
    if reason in HOST_LEAVING:
        return Outcome.HOST_DOWN
    if code.name in NEVER_RETRY:
        return Outcome.FINAL
    if reason in TRY_ELSEWHERE:
        return Outcome.ELSEWHERE
    return Outcome.FINAL


__all__ = ["NEVER_RETRY", "TRANSPORT_FAILURE", "Outcome", "RetryBudget", "StatusCode", "classify", "retry_after_ms"]


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
