"""HostdData.Infer on a hostd: a router's ModelInfer calls, many to a stream (protos/hostd_data.proto,
ground/forwarded.py). Each call is answered as a unary ModelInfer would be, by the same data plane, with the
same decoding (hostd/wire_request.py: large raw tensors stay views into the bytes that arrived), byte budget,
draining, deadline (the frame's `timeout_us`, and the call's `timeout` parameter) and statistics; its answer
frame carries the status code, message and trailing metadata (mmhost-reason, mmhost-request-id,
retry-after-ms, mmhost-served) the unary call would have had. Answers go out as calls finish, in any order,
every answer that is ready when a write starts in one message (ground/forwarded.py): the task of the call
that finished first writes, and answers that finish meanwhile go in its next message, with no writer task.

The tenant comes in each frame, as `mmhost-tenant` does on a unary call, from a router (with mutual TLS, the
router-certificate check has passed before this handler runs: ground.tls.PeerCheckInterceptor); a frame
without one is the dev-mode default tenant's, or UNAUTHENTICATED. A frame that cannot be read ends the
stream INVALID_ARGUMENT: nothing in it can be answered, not even its seq.

Bounds: at most MAX_INFLIGHT calls of one stream in flight, until their answers are written; at the bound the
stream is not read (gRPC's flow control then holds the router back). When the stream ends with calls in flight (the router went away, hostd
stops), they are cancelled. When the router half-closes, the calls in flight are answered first.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol, cast

import grpc
from grpc import aio

from ground.errors import InvalidArgument, ResourceExhausted
from ground.forwarded import METHOD, SERVICE_NAME, decode_call, encode_answer, frames, join, take
from ground.interceptors import decode, status_of
from ground.protowire import Malformed
from ground.streaming import abort_stream
from ground.wire import SERVED, Reason
from hostd import wire_request
from hostd.dataplane import DataPlane
from hostd.servicer import infer_served, no_tenant

__all__ = ["MAX_INFLIGHT", "METHOD", "SERVICE_NAME", "handler"]
MAX_INFLIGHT = 1024  # calls of one stream in flight at once (the router's own limits bound them first)


class StreamContext(Protocol):
    """What `serve` uses of its stream: a gRPC stream's context, or a data link's (hostd/data_port.py)."""

    async def read(self) -> Any: ...
    async def write(self, message: bytes) -> None: ...
    def set_trailing_metadata(self, metadata: Any) -> None: ...
    async def abort(self, code: Any, details: str) -> Any: ...


def handler(plane: DataPlane, default_tenant: str | None, max_message_bytes: int = 1 << 62) -> grpc.GenericRpcHandler:
    """The generic handler to add to hostd's server; `max_message_bytes`: its gRPC send limit (an answer over
    it is that call's RESOURCE_EXHAUSTED, not a write that ends the stream for every call on it)."""
    async def infer(requests, context: aio.ServicerContext) -> None:
        await serve(plane, default_tenant, context, max_message_bytes)

    return grpc.method_handlers_generic_handler(SERVICE_NAME, {"Infer": grpc.stream_stream_rpc_method_handler(infer)})


async def answer(plane: DataPlane, tenant: str, frame_request: memoryview, timeout_us: int) -> tuple[int, str, tuple, bytes]:
    """One call: (status code value, message, trailing metadata, response bytes), as the unary ModelInfer
    (hostd/servicer.py) would answer it."""
    try:
        request = decode(frame_request, wire_request.parse_infer_request)
        resp, served = await infer_served(plane, tenant, request, timeout_us / 1e6 if timeout_us > 0 else None,
                                          wire_request.RAW_INPUTS.get())
        return 0, "", ((SERVED, served.encode()),), resp.SerializeToString()
    except Exception as e:  # noqa: BLE001 - every failure is this call's answer (CancelledError is not one)
        code, text, md = status_of(e)
        return code.value[0], text, md, b""


def _error(seq: int, err: Exception) -> bytes:
    code, text, md = status_of(err)
    return encode_answer(seq, code.value[0], text, md, b"")


async def serve(plane: DataPlane, default_tenant: str | None, context: StreamContext,
                max_message_bytes: int = 1 << 62) -> None:
    slots = asyncio.Semaphore(MAX_INFLIGHT)  # a call's slot is given back once its answer is written
    ready: list[bytes] = []  # answers waiting to be written: a message carries as many as BATCH_BYTES allows
    writing = [False]  # a call's task is writing: the others leave their answers to it
    tasks: set[asyncio.Task] = set()
    broken: list[Exception] = []

    async def one(seq: int, tenant: str | None, request: memoryview, timeout_us: int) -> None:
        try:
            if tenant is None:
                out = _error(seq, no_tenant())
            else:
                out = encode_answer(seq, *await answer(plane, tenant, request, timeout_us))
                if len(out) + 16 > max_message_bytes:  # 16: the batch's framing around it
                    out = _error(seq, ResourceExhausted(
                        f"the answer is {len(out)} bytes, over the {max_message_bytes} a hostd sends in one message",
                        reason=Reason.MODEL_FAILED.value))
        except BaseException:  # cancelled (the stream ended): no answer to write
            slots.release()
            raise
        ready.append(out)
        if writing[0]:  # the task writing now sends it with the next message
            return
        writing[0] = True  # written from this task (no writer task to wake); what finishes meanwhile joins in
        try:
            while ready and not broken:
                batch = take(ready)
                try:
                    await context.write(join(batch))
                except Exception as e:  # noqa: BLE001 - the stream is over; say so to the reading loop
                    broken.append(e)
                finally:
                    for _ in batch:
                        slots.release()
        finally:
            writing[0] = False

    try:
        reading = True
        while reading and not broken:
            message = await context.read()
            if message is aio.EOF:
                break
            try:
                calls = [decode_call(f) for f in frames(message)]
            except Malformed as e:
                await abort_stream(cast(aio.ServicerContext, context), InvalidArgument(f"malformed ForwardedCalls message: {e}"))
                return
            for head, request in calls:
                await slots.acquire()
                if broken:
                    reading = False
                    break
                t = asyncio.create_task(one(head.seq, head.tenant or default_tenant, request, head.timeout_us))
                tasks.add(t)
                t.add_done_callback(tasks.discard)
        while tasks and not broken:  # half-closed: answer what is in flight (each task writes or hands over)
            await asyncio.wait(list(tasks), return_when=asyncio.FIRST_COMPLETED)
    finally:
        pending = [t for t in tasks if not t.done()]
        for t in pending:
            t.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
