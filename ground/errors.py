"""Errors that carry their gRPC status and their machine-readable reason (ground/wire.py `Reason`). Raised
anywhere below a servicer, on hostd and router alike; one interceptor (ground/interceptors.py) turns them
into statuses with `mmhost-reason` and `retry-after-ms` trailers, so handlers never build error responses.

What a caller reads is bounded and names nothing internal (PRODUCT.md, "Trust boundaries"): `public_message`
caps every message at MAX_MESSAGE_CHARS and replaces URLs, absolute paths and IP addresses (storage
descriptions, endpoints, buckets, cache paths) with `<internal>`; a ServingError's `detail` is for the log
only. Names a caller sent are echoed through `shown` (at most MAX_NAME_CHARS of them)."""

from __future__ import annotations

import re

import grpc

MAX_MESSAGE_CHARS = 1024  # whole status message; far under gRPC's 8 KiB metadata limit, where clients fail
MAX_NAME_CHARS = 64  # of a caller's name echoed in a message
INTERNAL = "<internal>"
_INTERNAL_RE = re.compile(
    r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s'\"]*[^\s'\".,:;)]"  # URLs: s3://bucket/prefix, http://endpoint:port, redis://host
    r"|(?<![\w.\-/])/[^\s'\":,;()\[\]]+/[^\s'\":,;()\[\]]*"  # absolute paths with two segments or more
    r"|\b\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?\b"  # IPv4 addresses, with a port
    r"|\blocalhost:\d+"
)


def shown(name: str) -> str:
    """A caller's name for a message: repr, cut to MAX_NAME_CHARS characters with '...' after."""
    return repr(name) if len(name) <= MAX_NAME_CHARS else repr(name[:MAX_NAME_CHARS]) + "..."


def scrub(text: str) -> str:
    """`text` with URLs, absolute paths and IP addresses replaced by `<internal>`."""
    return _INTERNAL_RE.sub(INTERNAL, text)


def cap(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def public_message(text: str) -> str:
    """What a caller may read of `text`: internal locations replaced, at most MAX_MESSAGE_CHARS."""
    return cap(scrub(text))


class ServingError(Exception):
    code: grpc.StatusCode = grpc.StatusCode.INTERNAL
    retry_after_ms: int | None = None

    def __init__(self, message: str, *, retry_after_ms: int | None = None, reason: str = "",
                 detail: str = "") -> None:
        super().__init__(message)
        self.message = message
        if retry_after_ms is not None:
            self.retry_after_ms = retry_after_ms
        self.reason = reason  # a shed or failure reason (wire.Reason value); "" for plain errors
        self.detail = detail  # the internal cause (endpoints, paths, exception text): logged, never sent
        self.request_id = ""  # a Forwarded error's id from the host that answered (logged there)
        self.trailers: tuple[tuple[str, str], ...] = ()  # more trailing metadata (a hostd's mmhost-served)

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


class PermissionDenied(ServingError):
    """An operator action asked for by a tenant (pinning a model)."""

    code = grpc.StatusCode.PERMISSION_DENIED


class AlreadyExists(ServingError):
    """A version that is already published (versions are immutable)."""

    code = grpc.StatusCode.ALREADY_EXISTS


class Forwarded(ServingError):
    """A hostd's error status, passed on unchanged (code, message, reason, retry-after-ms)."""

    def __init__(self, code: grpc.StatusCode, message: str, retry_after_ms: int | None = None,
                 reason: str = "", request_id: str = "") -> None:
        super().__init__(message, retry_after_ms=retry_after_ms, reason=reason)
        self.code = code
        self.request_id = request_id
        self.host = ""  # the host that answered (a router's access log)
        self.served: str | None = None  # its mmhost-served trailer (ground/served.py), not passed on
