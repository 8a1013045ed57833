"""Forwarding raw bytes to hostds over gRPC: one channel per host, multicallables without serializers (bytes
in, bytes out), so the router never decodes tensors. Forwarder is the dispatcher's HostClient
(router/host_client.py): gRPC errors become HostErrors here and nowhere else."""

from __future__ import annotations

from grpc import aio

from ground.wire import SERVICE
from protos import hostd_control_pb2 as hc
from router.host_client import HostError

__all__ = ["SERVICE", "STATUS_METHOD", "Forwarder"]
STATUS_METHOD = "/mmhost.hostd.HostdControl/Status"


class Forwarder:
    def __init__(self, max_message_bytes: int) -> None:
        self._options = [("grpc.max_receive_message_length", max_message_bytes),
                         ("grpc.max_send_message_length", max_message_bytes),
                         ("grpc.enable_retries", 0)]
        self._channels: dict[str, aio.Channel] = {}
        self._calls: dict[tuple[str, str], aio.UnaryUnaryMultiCallable] = {}

    def _channel(self, address: str) -> aio.Channel:
        ch = self._channels.get(address)
        if ch is None:
            ch = self._channels[address] = aio.insecure_channel(address, options=self._options)
        return ch

    def _callable(self, address: str, method: str) -> aio.UnaryUnaryMultiCallable:
        k = (address, method)
        c = self._calls.get(k)
        if c is None:
            c = self._calls[k] = self._channel(address).unary_unary(f"/{SERVICE}/{method}")
        return c

    async def unary(self, address: str, method: str, body: bytes, *, timeout: float | None,
                    metadata: tuple[tuple[str, str], ...]) -> bytes:
        """The hostd's response bytes; HostError on any failure."""
        try:
            return await self._callable(address, method)(body, timeout=timeout, metadata=metadata)
        except aio.AioRpcError as e:
            raise HostError(e.code(), e.details() or "", tuple(e.trailing_metadata() or ())) from None

    async def status(self, address: str, timeout: float) -> hc.HostStatus:
        c = self._channel(address).unary_unary(STATUS_METHOD, request_serializer=hc.StatusRequest.SerializeToString,
                                               response_deserializer=hc.HostStatus.FromString)
        return await c(hc.StatusRequest(), timeout=timeout)

    async def forget(self, keep: set[str]) -> None:
        """Close channels to hosts that left the view."""
        for addr in [a for a in self._channels if a not in keep]:
            ch = self._channels.pop(addr)
            for k in [k for k in self._calls if k[0] == addr]:
                del self._calls[k]
            await ch.close()

    async def close(self) -> None:
        await self.forget(set())
