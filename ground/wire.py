"""The wire contract: everything two mmhost processes (or a client and mmhost) must agree on, in one place.

gRPC status codes plus machine-readable metadata carry meaning between processes; nothing ever matches
words in a status message.

Metadata a router sends to a hostd:
    mmhost-tenant      the authenticated tenant; hostd resolves model names within it

Trailing metadata on every error mmhost itself answers (router or hostd):
    mmhost-reason      why, as one of the `Reason` values (machine-readable; the message is for people)
    retry-after-ms     on refusals the caller may retry: how long to wait first
    mmhost-request-id  a short id the process that answered logged the error's details under (endpoints,
                       buckets, paths and exception text never reach a tenant; an operator finds them by
                       this id). A router passes a hostd's id on with the hostd's status.

A failed request inside a ModelStreamInfer stream is answered on the stream, not with a status: its
ModelStreamInferResponse has `error_message` and, in `infer_response.parameters`, the same keys as the
trailers above plus
    mmhost-status      the status code's name a unary call would have had (NOT_FOUND, RESOURCE_EXHAUSTED, ...)
(ground/streaming.py).

Trailing metadata on a hostd's ModelInfer answer, OK or error, once the request's model version is known:
    mmhost-served      what served it: version, the model's stored size, and the seconds spent waiting for
                       a load, queued and computing (ground/served.py). A router writes it to its access
                       log and passes it on to nobody. An OK answer to a call through a router's fast lane
                       (`mmhost-lane: fast`) has none: HAProxy cannot log trailers, and would pass them on
                       (router/fastlane_config.py). Refusals have it in their headers (trailers-only answers),
                       where HAProxy logs it and then removes it.

An error status that carries no `mmhost-reason` did not come from an mmhost process: the transport
failed (connection refused or reset, stream torn down) or something in between answered. That is what a
router treats as "host down" (see router/failover.py).

Heartbeats in Redis, under a prefix P (default `mmhost:hosts:`):
    P index          SET of host ids (readers drop members whose status key has expired)
    P h:<host id>    HostStatus (protos/hostd_control.proto), serialized, with a TTL
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum

SERVICE = "inference.GRPCInferenceService"
CONTROL_SERVICE = "mmhost.hostd.HostdControl"
UPLOADS_SERVICE = "mmhost.uploads.Uploads"  # on routers: tenants publish models (protos/uploads.proto)

TENANT_HEADER = "mmhost-tenant"
REASON = "mmhost-reason"
RETRY_AFTER = "retry-after-ms"
REQUEST_ID = "mmhost-request-id"
LANE_HEADER = "mmhost-lane"  # "fast": the call came through a router's fast lane (router/fastlane_config.py)
SERVED = "mmhost-served"  # on a hostd's ModelInfer answer: what served it (ground/served.py)
STATUS = "mmhost-status"  # a streamed request's error answer: the status code's name (ground/streaming.py)

# What ServerMetadata advertises, on hostd and router alike (Triton's extension names).
EXTENSIONS = ("model_repository", "schedule_policy", "model_configuration", "binary_tensor_data", "parameters",
              "statistics")


class Reason(str, Enum):
    """Why a call was refused or failed: the value of the `mmhost-reason` trailer."""

    # refusals (sheds): the caller may retry after retry-after-ms
    QUOTA_RATE = "quota_rate"
    QUOTA_CONCURRENCY = "quota_concurrency"
    QUEUE_FULL = "queue_full"
    INFLIGHT_BYTES = "inflight_bytes"  # the process's (or the tenant's) budget of request bytes in flight is full
    QUEUE_TIMEOUT = "queue_timeout"
    DEADLINE = "deadline"
    DEADLINE_INFEASIBLE = "deadline_infeasible"
    NO_CAPACITY = "no_capacity"
    NO_HOST = "no_host"
    STORAGE_DOWN = "storage_down"
    CATALOG_DOWN = "catalog_down"
    DRAINING = "draining"  # this host is leaving: the router marks it down and goes elsewhere
    UNLOADING = "unloading"
    UNLOADED = "unloaded"
    # a model's own failure: the model's error, never the host's
    LOAD_FAILED = "load_failed"
    MODEL_FAILED = "model_failed"
    # the caller's mistakes and everything else
    INVALID_ARGUMENT = "invalid_argument"
    NOT_FOUND = "not_found"
    UNAUTHENTICATED = "unauthenticated"
    PERMISSION_DENIED = "permission_denied"  # an operator action asked for by a tenant (e.g. pinning a model)
    # tenant uploads (router/uploads.py)
    UPLOAD_TOO_LARGE = "upload_too_large"  # the file is over upload_max_bytes (no retry will help)
    UPLOADS_BUSY = "uploads_busy"  # upload_concurrency uploads in progress (or one of this tenant's): retry later
    MODEL_INVALID = "model_invalid"  # the model failed validation: nothing was stored
    VERSION_EXISTS = "version_exists"  # the version named is already published (versions are immutable)
    INTERNAL = "internal"


# Reasons with which a hostd says the host itself should get no more traffic for now.
HOST_LEAVING = frozenset({Reason.DRAINING.value})
# Reasons that belong to one model on one host: another host may well serve the request. Not storage_down:
# every host reads the same store, so a second host would only make the caller wait its storage bound again.
TRY_ELSEWHERE = frozenset({Reason.NO_CAPACITY.value, Reason.UNLOADING.value, Reason.UNLOADED.value,
                           Reason.QUEUE_FULL.value})


def trailer(metadata: Iterable[tuple[str, str | bytes]] | None, key: str) -> str | None:
    """The value of one metadata key (None when absent)."""
    for k, v in metadata or ():
        if k == key:
            return v.decode() if isinstance(v, bytes) else v
    return None


def retry_after_ms(metadata: Iterable[tuple[str, str | bytes]] | None) -> int | None:
    v = trailer(metadata, RETRY_AFTER)
    try:
        return None if v is None else int(v)
    except ValueError:
        return None


def reason_of(metadata: Iterable[tuple[str, str | bytes]] | None) -> str | None:
    return trailer(metadata, REASON)


HEARTBEAT_PREFIX = "mmhost:hosts:"


def heartbeat_index_key(prefix: str) -> str:
    return f"{prefix}index"


def heartbeat_status_key(prefix: str, host_id: str) -> str:
    return f"{prefix}h:{host_id}"
