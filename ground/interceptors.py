"""One place where exceptions become gRPC statuses (KServe's pattern), on hostd and router alike:
ServingError keeps its code and message and adds the `mmhost-reason` trailer (always) and `retry-after-ms`
(when it has one); anything else is INTERNAL with reason `internal`, logged with its traceback, and never
crashes the server."""

from __future__ import annotations

import logging

import grpc
from grpc import aio

from ground.errors import ServingError
from ground.wire import REASON, RETRY_AFTER, Reason

log = logging.getLogger(__name__)


async def _abort(context: aio.ServicerContext, err: Exception) -> None:
    if isinstance(err, ServingError):
        md: tuple[tuple[str, str], ...] = ((REASON, err.wire_reason),)
        if err.retry_after_ms is not None:
            md += ((RETRY_AFTER, str(int(err.retry_after_ms))),)
        context.set_trailing_metadata(md)
        await context.abort(err.code, err.message)
    log.exception("internal error", exc_info=err)
    context.set_trailing_metadata(((REASON, Reason.INTERNAL.value),))
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
