"""ModelStreamInfer on a router: Triton's bidirectional streaming (tritonclient's `start_stream` /
`async_stream_infer`, the asyncio client's `stream_infer`, `perf_analyzer --streaming`) as a shell over
ground/streaming.py's loop.

The stream's caller is authenticated once, from the stream's invocation metadata, before anything is read (a
refusal ends the stream UNAUTHENTICATED with `mmhost-reason`). Every request read off the stream then takes
exactly the path of a unary ModelInfer (`RouterServicer.ModelInfer` with the stream's context and that
tenant): byte budget, catalog check, admission, dispatch, access log and metrics, each per request. Each
request is forwarded to a hostd as a unary ModelInfer, so placement, retries and failover stay per request and
one stream may be served by several hosts; a hostd's own ModelStreamInfer is not used.

Deadlines: the stream's gRPC deadline bounds every request in it (ModelInfer reads the time left off the
context when the request arrives), and each request's `timeout` parameter bounds it further. When the
deadline passes, gRPC ends the stream DEADLINE_EXCEEDED and the requests in flight are cancelled.

Bytes: a request's size is charged to its tenant when it is read (ModelInfer), and at most MAX_INFLIGHT
requests of a stream are in flight, after which the stream is not read (backpressure); unread bodies wait in
gRPC's flow-control window. Answers are forwarded without decoding: the hostd's ModelInferResponse bytes are
wrapped as field 2 of ModelStreamInferResponse.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from grpc import aio

from ground.errors import InvalidArgument, ServingError
from ground.streaming import MAX_INFLIGHT, abort_stream, error_response, serve_stream
from ground.protowire import encode_varint
from router.header import read_header

if TYPE_CHECKING:
    from router.servicer import RouterServicer

_INFER_RESPONSE_TAG = b"\x12"  # ModelStreamInferResponse.infer_response: field 2, length-delimited


def wrap_response(infer_response: bytes) -> bytes:
    """ModelStreamInferResponse(infer_response=...) serialized, from the ModelInferResponse's bytes."""
    return b"".join((_INFER_RESPONSE_TAG, encode_varint(len(infer_response)), infer_response))


def failed(body: bytes | None, err: Exception) -> bytes:
    """A request's error answer, naming its model, version and id when its header can be read."""
    try:
        if body is None:
            raise InvalidArgument("no body")
        h = read_header(body)
        model, version, rid = h.model_name, h.model_version, h.id
    except InvalidArgument:
        model = version = rid = ""
    return error_response(err, model, version, rid).SerializeToString()


def stream_handler(servicer: RouterServicer, max_inflight: int = MAX_INFLIGHT
                   ) -> Callable[[Any, aio.ServicerContext], Awaitable[None]]:
    """The ModelStreamInfer handler (raw bytes in and out) for `grpc.stream_stream_rpc_method_handler`."""

    async def ModelStreamInfer(request_iterator, context: aio.ServicerContext) -> None:
        try:
            tenant = servicer._tenant(context)
        except ServingError as e:
            await abort_stream(context, e)
            return

        async def answer(body: bytes) -> bytes:
            return wrap_response(await servicer.ModelInfer(body, context, tenant))

        await serve_stream(context, answer, failed, max_inflight=max_inflight)

    return ModelStreamInfer
