"""One place where exceptions become gRPC statuses (KServe's pattern): ServingError keeps its code and
message and adds `retry-after-ms` trailing metadata when it has one; anything else is INTERNAL, logged
with its traceback, and never crashes the server."""

from __future__ import annotations

import logging

import grpc
from grpc import aio

from hostd.errors import ServingError

log = logging.getLogger(__name__)


async def _abort(context: aio.ServicerContext, err: Exception) -> None:
    if isinstance(err, ServingError):
        if err.retry_after_ms is not None:
            context.set_trailing_metadata((("retry-after-ms", str(int(err.retry_after_ms))),))
        await context.abort(err.code, err.message)
    log.exception("internal error", exc_info=err)
    await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {type(err).__name__}: {err}")


def _wrap_unary(behavior):
    async def wrapper(request, context):
        try:
            return await behavior(request, context)
        except aio.AbortError:
            raise
        except Exception as e:  # noqa: BLE001 - this is the one place errors become statuses
            await _abort(context, e)

    return wrapper


class ErrorInterceptor(aio.ServerInterceptor):
    """Wraps each unary handler once and reuses the wrapper: intercept_service runs on every call."""

    def __init__(self) -> None:
        self._wrapped: dict[int, tuple[object, grpc.RpcMethodHandler]] = {}

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler
        hit = self._wrapped.get(id(handler))
        if hit is not None and hit[0] is handler:
            return hit[1]
        wrapped = grpc.unary_unary_rpc_method_handler(
            _wrap_unary(handler.unary_unary),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
        if len(self._wrapped) > 1024:  # handlers are per method; a server that builds them per call stays bounded
            self._wrapped.clear()
        self._wrapped[id(handler)] = (handler, wrapped)  # holding `handler` keeps its id from being reused
        return wrapped
