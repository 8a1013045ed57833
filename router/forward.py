"""Forwarding raw bytes to hostds over gRPC: one channel per host, multicallables without serializers (bytes
in, bytes out), so the router never decodes tensors. Forwarder is the dispatcher's HostClient
(router/host_client.py): gRPC errors become HostErrors here and nowhere else.

With TLS to hostds (RouterSettings.hostd_ca, ground.tls.router_to_hostd) channels are secure channels that
present the router's client certificate and verify hostds by name (target_name_options). When the
certificate files change (rotation), `rotate()` (called on the router's refresh loop) swaps in new channels;
the old ones close after a grace period, so calls in flight on them finish. Data links to hostds
(router/host_streams.py) take the same files (ground/link_tls.py) and are opened again after a rotation."""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Callable

from grpc import aio

from ground.wire import SERVICE, TENANT_HEADER
from protos import hostd_control_pb2 as hc
from ground import link_tls
from ground.tls import HOSTD_TLS_NAME, ClientTLSFiles
from router.host_client import HostError
from router.host_streams import HostStreams, LinkUnavailable, StreamsUnsupported

__all__ = ["SERVICE", "STATUS_METHOD", "Forwarder"]
log = logging.getLogger(__name__)
STATUS_METHOD = "/mmhost.hostd.HostdControl/Status"


class Forwarder:
    def __init__(self, max_message_bytes: int, tls: ClientTLSFiles | None = None,
                 tls_options: list[tuple[str, str]] | None = None, rotate_grace_s: float = 30.0,
                 streams: int = 0, stream_max_body_bytes: int = 0,
                 on_stream_end: Callable[[str], None] | None = None, tls_name: str = HOSTD_TLS_NAME) -> None:
        """`streams`: ModelInfer calls go to each host on up to this many streams (router/host_streams.py),
        those with bodies up to `stream_max_body_bytes`; 0: one unary call each. `on_stream_end`: told how each
        stream that the host ended, or that broke, ended (router/host_streams.py). `tls_name`: the name hostds'
        certificates carry (data links check it; `tls_options` carries it for gRPC)."""
        self._options = [("grpc.max_receive_message_length", max_message_bytes),
                         ("grpc.max_send_message_length", max_message_bytes),
                         ("grpc.enable_retries", 0)] + list(tls_options or ())
        self._tls = tls
        self._creds, self._generation = tls.credentials() if tls is not None else (None, 0)
        self._grace = rotate_grace_s
        self._channels: dict[str, aio.Channel] = {}
        self._calls: dict[tuple[str, str], aio.UnaryUnaryMultiCallable] = {}
        self._retired: dict[asyncio.Task, aio.Channel] = {}  # old channels closing after a rotation
        self._streams = HostStreams(streams, stream_max_body_bytes, on_end=on_stream_end,
                                    max_message_bytes=max_message_bytes)
        self._tls_name = tls_name
        if tls is not None:
            self._streams.set_tls(link_tls.client_context(*tls.paths), tls_name)

    def _channel(self, address: str) -> aio.Channel:
        ch = self._channels.get(address)
        if ch is None:
            ch = self._channels[address] = (
                aio.secure_channel(address, self._creds, options=self._options) if self._creds is not None
                else aio.insecure_channel(address, options=self._options))
        return ch

    @property
    def generation(self) -> int:
        """The generation of the client certificate files the channels use (0 without TLS)."""
        return self._generation

    async def rotate(self) -> bool:
        """Re-read the client certificate files; when they changed, new calls go on new channels (built with
        the new certificate) and the old channels close once their calls had `rotate_grace_s` to finish."""
        if self._tls is None:
            return False
        creds, gen = await asyncio.to_thread(self._tls.credentials)
        if gen == self._generation:
            return False
        self._creds, self._generation = creds, gen
        try:
            self._streams.set_tls(await asyncio.to_thread(link_tls.client_context, *self._tls.paths), self._tls_name)
        except (OSError, ssl.SSLError) as e:  # changed again since: the next rotation takes it
            log.warning("data links keep the previous client certificate: %s", e)
        old, self._channels = self._channels, {}
        self._calls.clear()
        self._streams.drop()
        for ch in old.values():
            self._retire(ch)
        return True

    def _callable(self, address: str, method: str) -> aio.UnaryUnaryMultiCallable:
        k = (address, method)
        c = self._calls.get(k)
        if c is None:
            c = self._calls[k] = self._channel(address).unary_unary(f"/{SERVICE}/{method}")
        return c

    async def unary(self, address: str, method: str, body: bytes, *, timeout: float | None,
                    metadata: tuple[tuple[str, str], ...], trailers: list | None = None, lane: str = "") -> bytes:
        """The hostd's response bytes; HostError on any failure. `trailers`: gets the answer's trailing
        metadata on success (the errors carry theirs). ModelInfer goes on a stream (router/host_streams.py)
        unless streams are off or the body is big; `lane` (the model's key) picks the streams it may share."""
        if method == "ModelInfer" and len(metadata) == 1 and self._streams.takes(address, body):
            started = time.monotonic()
            try:
                try:
                    resp, trailing = await self._streams.call(self._channel(address), address, _tenant(metadata),
                                                              body, timeout, lane)
                except LinkUnavailable:  # the host's data link cannot be reached: again, on a gRPC stream
                    left = None if timeout is None else timeout - (time.monotonic() - started)
                    resp, trailing = await self._streams.call(self._channel(address), address, _tenant(metadata),
                                                              body, left, lane)
            except StreamsUnsupported:  # a hostd from before HostdData: this call and the next ones go unary
                pass
            else:
                if trailers is not None:
                    trailers.extend(trailing)
                return resp
        try:
            call = self._callable(address, method)(body, timeout=timeout, metadata=metadata)
            resp = await call
            if trailers is not None:
                trailers.extend(await call.trailing_metadata() or ())
            return resp
        except aio.AioRpcError as e:
            raise HostError(e.code(), e.details() or "", tuple(e.trailing_metadata() or ())) from None

    async def status(self, address: str, timeout: float) -> hc.HostStatus:
        c = self._channel(address).unary_unary(STATUS_METHOD, request_serializer=hc.StatusRequest.SerializeToString,
                                               response_deserializer=hc.HostStatus.FromString)
        return await c(hc.StatusRequest(), timeout=timeout)

    async def forget(self, keep: set[str]) -> None:
        """Close channels to hosts that left the view, in the background once the calls on them had
        `rotate_grace_s` to finish (closing at once cancels them: a request would pay for the view's change)."""
        for addr in [a for a in self._channels if a not in keep]:
            ch = self._channels.pop(addr)
            self._streams.drop(addr)
            for k in [k for k in self._calls if k[0] == addr]:
                del self._calls[k]
            self._retire(ch)

    def set_data_ports(self, ports: dict[str, int]) -> None:
        """The hosts' data ports (address -> HostStatus.data_port): their streams go on data links
        (router/host_streams.py), with TLS when the channels have it."""
        self._streams.set_links(ports)

    def sweep(self) -> int:
        """Close the streams of models that went idle (router/host_streams.py); on the router's refresh.
        Returns the streams still open."""
        self._streams.sweep()
        return self._streams.open_streams()

    def _retire(self, ch: aio.Channel) -> None:
        t = asyncio.get_running_loop().create_task(ch.close(grace=self._grace))
        self._retired[t] = ch
        t.add_done_callback(lambda done: self._retired.pop(done, None))

    async def close(self) -> None:
        self._streams.cancel_all()
        for ch in self._channels.values():
            await ch.close()
        self._channels.clear()
        self._calls.clear()
        for t, ch in list(self._retired.items()):
            t.cancel()
            await ch.close()


def _tenant(metadata: tuple[tuple[str, str], ...]) -> str:
    for k, v in metadata:
        if k == TENANT_HEADER:
            return v
    return ""
