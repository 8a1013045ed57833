"""What the dispatcher needs from a connection to hostds, and nothing more: send one unary call's bytes to
an address, get the response bytes or a HostError. router/forward.py's Forwarder is the gRPC one; the unit
tests use a fake host (no processes, no server)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import grpc

from ground.errors import Forwarded
from ground.wire import REQUEST_ID, SERVED, reason_of, retry_after_ms, trailer

Metadata = Sequence[tuple[str, str | bytes]]


class HostError(Exception):
    """A call to a host failed: its status code, details and trailing metadata (where `mmhost-reason` says
    why, when an mmhost process answered at all)."""

    def __init__(self, code: grpc.StatusCode, details: str = "", trailing: Metadata = ()) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code, self.details, self.trailing = code, details, tuple(trailing)

    @property
    def reason(self) -> str | None:
        return reason_of(self.trailing)

    def forwarded(self, host: str = "") -> Forwarded:
        """The same status, to pass on to the caller unchanged; `host` (the address that answered) and the
        hostd's `mmhost-served` go with it for the access log, not to the caller."""
        err = Forwarded(self.code, self.details, retry_after_ms(self.trailing), self.reason or "",
                        trailer(self.trailing, REQUEST_ID) or "")
        err.host, err.served = host, trailer(self.trailing, SERVED)
        return err


class HostClient(Protocol):
    async def unary(self, address: str, method: str, body: bytes, *, timeout: float | None,
                    metadata: tuple[tuple[str, str], ...], trailers: list | None = None, lane: str = "") -> bytes:
        """The host's response bytes; HostError on any failure (the host's status or the transport's).
        `trailers` (when given) gets the answer's trailing metadata on success. `lane`: the model's key, for
        a connection that multiplexes calls (router/host_streams.py): calls of different lanes never queue
        behind one another."""
        ...
