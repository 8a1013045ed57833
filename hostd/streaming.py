"""ModelStreamInfer on a hostd, for Triton's tools pointed at a hostd directly (a router forwards each request
of a stream as a unary ModelInfer and never calls this): a shell over ground/streaming.py's loop.

The tenant is read off the stream once (`mmhost-tenant`, or the dev-mode default), before anything is read; a
stream without one ends UNAUTHENTICATED with `mmhost-reason`. Each request then goes to DataPlane.infer as a
unary call would, with the time left on the stream's gRPC deadline (its `timeout` parameter bounds it
further), so draining, the byte budget, statistics and metrics count it like any other request. Requests
arrive decoded by the generated handler's deserializer; a message it cannot decode is answered
INVALID_ARGUMENT on the stream (ground/streaming.py) and the stream goes on.
"""

from __future__ import annotations

from collections.abc import Callable

from grpc import aio

from ground.errors import ServingError
from ground.streaming import MAX_INFLIGHT, abort_stream, error_response, serve_stream
from hostd.dataplane import DataPlane
from protos import grpc_service_pb2 as pb


def failed(request: pb.ModelInferRequest | None, err: Exception) -> pb.ModelStreamInferResponse:
    """A request's error answer; `request` is None for a message that could not be decoded."""
    if request is None:
        return error_response(err)
    return error_response(err, request.model_name, request.model_version, request.id)


async def serve(plane: DataPlane, tenant_of: Callable[[aio.ServicerContext], str], context: aio.ServicerContext,
                max_inflight: int = MAX_INFLIGHT) -> None:
    """Serve one ModelStreamInfer call until the client half-closes (or the call ends)."""
    try:
        tenant = tenant_of(context)
    except ServingError as e:
        await abort_stream(context, e)
        return

    async def answer(request: pb.ModelInferRequest) -> pb.ModelStreamInferResponse:
        resp = await plane.infer(tenant, request, context.time_remaining())
        return pb.ModelStreamInferResponse(infer_response=resp)

    await serve_stream(context, answer, failed, max_inflight=max_inflight)
