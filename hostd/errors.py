"""Errors that carry their gRPC status. Raised anywhere below the servicer; one interceptor turns them into
statuses (hostd/interceptors.py), so handlers never build error responses themselves."""

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
        self.reason = reason


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


class FailedPrecondition(ServingError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class Internal(ServingError):
    code = grpc.StatusCode.INTERNAL
