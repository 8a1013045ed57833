"""The router's errors. They are hostd's ServingError kind, so hostd's one interceptor turns them into
statuses here too."""

from __future__ import annotations

import grpc

from hostd.errors import ServingError


class Unauthenticated(ServingError):
    code = grpc.StatusCode.UNAUTHENTICATED


class Forwarded(ServingError):
    """A hostd's error status, passed on unchanged (code, details, retry-after-ms)."""

    def __init__(self, code: grpc.StatusCode, message: str, retry_after_ms: int | None = None) -> None:
        super().__init__(message, retry_after_ms=retry_after_ms)
        self.code = code
