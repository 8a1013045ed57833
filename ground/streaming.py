"""ModelStreamInfer's loop (Triton's bidirectional streaming extension), on router and hostd alike: one core,
two shells (router/streaming.py, hostd/streaming.py).

A stream is a sequence of independent ModelInfer requests. Each is answered once, as soon as it completes
(concurrently, so possibly out of order: responses carry the request's `id`), as
`ModelStreamInferResponse(infer_response=...)`; a request that fails is answered with `error_message` and
the stream goes on (what Triton does for non-decoupled models; tritonclient hands it to the stream's callback
as an InferenceServerException). A failed answer also carries `infer_response` with the request's model,
version and id and, as parameters, the machine-readable contract a unary call has in its trailers:
`mmhost-status` (the status code's name), `mmhost-reason`, `mmhost-request-id` and, on refusals that may be
retried, `retry-after-ms` (ground/wire.py). tritonclient ignores those; raw gRPC clients can match on them.

Bounds: at most `max_inflight` requests of one stream are in flight; at the bound the loop stops reading the
stream, so gRPC's flow control holds the client back (backpressure). A request's slot is given back once its
answer is written. Deadlines are the shells' business (a stream's gRPC deadline bounds each request in it).
When the stream ends with requests in flight (the client cancelled, the deadline passed, a write failed) they
are cancelled, and nothing is written after the handler returns. When the client half-closes, the requests
in flight are answered and the stream ends OK.

Errors of the stream itself (authentication) are not per request: `abort_stream` ends the call with the status
and trailers the error interceptor would give a unary call (that interceptor wraps unary handlers only).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from google.protobuf.message import DecodeError
from grpc import aio

from ground.errors import Internal, InvalidArgument
from ground.interceptors import status_of
from ground.wire import REASON, REQUEST_ID, RETRY_AFTER, STATUS
from protos import grpc_service_pb2 as pb

MAX_INFLIGHT = 64  # requests of one stream in flight at once; past it the stream is not read
_MALFORMED = object()  # a message that could not be decoded: answered INVALID_ARGUMENT, the stream goes on


def error_response(err: Exception, model: str = "", version: str = "", request_id: str = "") -> pb.ModelStreamInferResponse:
    """A failed request's answer: the message a unary call's status would carry (public: scrubbed, bounded;
    internal errors are logged under a request id) and the trailers' contract as response parameters."""
    code, text, md = status_of(err)
    params = {STATUS: pb.InferParameter(string_param=code.name)}
    for key, value in md:
        if key == RETRY_AFTER:
            params[key] = pb.InferParameter(int64_param=int(value))
        elif key in (REASON, REQUEST_ID):
            params[key] = pb.InferParameter(string_param=value)
    return pb.ModelStreamInferResponse(error_message=text, infer_response=pb.ModelInferResponse(
        model_name=model, model_version=version, id=request_id, parameters=params))


async def abort_stream(context: aio.ServicerContext, err: Exception) -> None:
    """End the stream with `err`'s status, `mmhost-reason` and `mmhost-request-id` trailers (raises AbortError)."""
    code, text, md = status_of(err)
    context.set_trailing_metadata(md)
    await context.abort(code, text)


async def serve_stream(context: aio.ServicerContext, answer: Callable[[Any], Awaitable[Any]],
                       failed: Callable[[Any, Exception], Any], *, max_inflight: int = MAX_INFLIGHT) -> None:
    """Read requests off `context` until the client half-closes; `answer(request)` each one concurrently (at most
    `max_inflight` at once) and write what it returns, or `failed(request, error)` when it raises (`request` is
    None for a message the handler's deserializer could not decode). Returns once every request read has been
    answered; cancelled (the call ended), it cancels the requests in flight first."""
    slots = asyncio.Semaphore(max_inflight)
    writing = asyncio.Lock()  # one message at a time on the stream
    tasks: set[asyncio.Task] = set()
    broken: list[Exception] = []  # a failed write (the client went away: gRPC cancels this handler next)

    async def one(request: Any) -> None:
        try:
            try:
                if request is _MALFORMED:
                    raise InvalidArgument("malformed ModelInferRequest: cannot decode it")
                out = await answer(request)
            except Exception as e:  # noqa: BLE001 - every failure is this request's answer (CancelledError is not one)
                out = failed(None if request is _MALFORMED else request, e)
            async with writing:
                try:
                    if not broken:
                        await context.write(out)
                except Exception as e:  # noqa: BLE001 - the stream is over; say so to the reading loop
                    broken.append(e)
        finally:
            slots.release()

    try:
        while True:
            await slots.acquire()
            if broken:
                break
            try:
                request = await context.read()
            except DecodeError:  # refused by the handler's deserializer (hostd's): that request's answer
                request = _MALFORMED
            if request is aio.EOF:
                slots.release()
                break
            t = asyncio.create_task(one(request))
            tasks.add(t)
            t.add_done_callback(tasks.discard)
        while tasks and not broken:  # half-closed: answer what is in flight
            await asyncio.wait(list(tasks), return_when=asyncio.FIRST_COMPLETED)
        if broken and not context.done():  # a write failed on a call still open: end it; `finally` cancels the rest
            await abort_stream(context, Internal("the stream's answers could not be sent", detail=repr(broken[0])))
    finally:
        pending = [t for t in tasks if not t.done()]
        for t in pending:
            t.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
