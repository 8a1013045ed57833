"""Errors that carry their gRPC status and their machine-readable reason (ground/wire.py `Reason`). Raised
anywhere below a servicer, on hostd and router alike; one interceptor (ground/interceptors.py) turns them
into statuses with `mmhost-reason` and `retry-after-ms` trailers, so handlers never build error responses."""

from __future__ import annotations

import grpc


class ServingError(Exception):
    code: grpc.StatusCode = grpc.StatusCode.INTERNAL
    retry_after_ms: int | None = None

    def __init__(self, message: str, *, retry_after_ms: int | None = None, reason: str = "") -> None:
        super().__init__(message)
        self.message = message
        if retry_after_ms is not None:
            self.retry_after_ms = retry_after_ms
        self.reason = reason  # a shed or failure reason (wire.Reason value); "" for plain errors

    @property
    def wire_reason(self) -> str:
        """What the `mmhost-reason` trailer says: the reason, else the status code's name."""
        return self.reason or self.code.name.lower()


class InvalidArgument(ServingError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(ServingError):
    code = grpc.StatusCode.NOT_FOUND


class Unavailable(ServingError):
    """No capacity, storage down, model failed to load, server draining."""

    code = grpc.StatusCode.UNAVAILABLE


class ResourceExhausted(ServingError):
    """Quota or queue full."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class DeadlineExceeded(ServingError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Internal(ServingError):
    code = grpc.StatusCode.INTERNAL


class Unauthenticated(ServingError):
    code = grpc.StatusCode.UNAUTHENTICATED


class Forwarded(ServingError):
    """A hostd's error status, passed on unchanged (code, message, reason, retry-after-ms)."""

    def __init__(self, code: grpc.StatusCode, message: str, retry_after_ms: int | None = None,
                 reason: str = "") -> None:
        super().__init__(message, retry_after_ms=retry_after_ms, reason=reason)
        self.code = code
