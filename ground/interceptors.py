"""One place where exceptions become gRPC statuses (KServe's pattern), on hostd and router alike:
ServingError keeps its code and adds the `mmhost-reason` trailer (always), `retry-after-ms` (when it has one)
and `mmhost-request-id` (always); anything else is INTERNAL with reason `internal`, logged with its traceback
under that id, and never crashes the server.

What the caller reads is `ground.errors.public_message` of the error's message: at most ~1 KB, with no URL,
absolute path or IP address in it. When something was withheld (the error's `detail`, a scrubbed location,
an internal error's text) the message ends with "(request id ID)" and the whole of it is logged with that id.

Request bodies are decoded here, not by grpc: a handler registered with a generated deserializer (hostd's
servicer, the control service) gets the raw bytes decoded inside the wrapper, so an undecodable body is
INVALID_ARGUMENT with reason `invalid_argument`, never grpc's own UNKNOWN (which a router would read as a
failed transport and mark a healthy host down for)."""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Mapping

import logging
import secrets

import grpc
from grpc import aio

from ground.errors import MAX_MESSAGE_CHARS, Forwarded, InvalidArgument, ServingError, cap, scrub
from ground.wire import REASON, REQUEST_ID, RETRY_AFTER, Reason

log = logging.getLogger(__name__)


def new_request_id() -> str:
    return secrets.token_hex(6)


def status_of(err: Exception) -> tuple[grpc.StatusCode, str, tuple[tuple[str, str], ...]]:
    """(code, caller-facing message, trailing metadata) for an exception; logs what the caller does not see."""
    if isinstance(err, ServingError):
        rid = (err.request_id if isinstance(err, Forwarded) else "") or new_request_id()
        text = scrub(err.message)
        if (err.detail or text != err.message) and not isinstance(err, Forwarded):
            # a detail is the process's own trouble (warning); a scrubbed message alone may be a caller's odd name
            log.log(logging.WARNING if err.detail else logging.INFO, "request %s: %s %s%s", rid, err.code.name,
                    cap(err.message, 4096), f" ({err.detail})" if err.detail else "")
            text = f"{cap(text, MAX_MESSAGE_CHARS - 40)} (request id {rid})"
        text = cap(text)
        md: tuple[tuple[str, str], ...] = ((REASON, err.wire_reason), (REQUEST_ID, rid))
        if err.retry_after_ms is not None:
            md += ((RETRY_AFTER, str(int(err.retry_after_ms))),)
        return err.code, text, md + err.trailers
    rid = new_request_id()
    log.error("request %s: internal error", rid, exc_info=err)
    return (grpc.StatusCode.INTERNAL, f"internal error (request id {rid})",
            ((REASON, Reason.INTERNAL.value), (REQUEST_ID, rid)))


async def _abort(context: aio.ServicerContext, err: Exception) -> None:
    code, text, md = status_of(err)
    context.set_trailing_metadata(md)
    await context.abort(code, text)


# The size on the wire of the request being handled (this task's), set where the bytes are decoded: what a
# handler charges against a byte budget without walking the decoded message (reading a bytes field of a upb
# message copies it: 1.5 ms for an 8 MiB tensor).
WIRE_BYTES: contextvars.ContextVar[int] = contextvars.ContextVar("mmhost_wire_bytes", default=0)


def decode(body: bytes | memoryview, deserializer: Callable[[bytes], object]) -> object:
    """A request body decoded in this task (WIRE_BYTES set to its size); InvalidArgument when it cannot be:
    never grpc's own UNKNOWN, which a router would read as a failed transport."""
    WIRE_BYTES.set(len(body))
    try:
        return deserializer(body)  # type: ignore[arg-type]
    except Exception as e:  # noqa: BLE001 - protobuf raises DecodeError and, on odd input, others
        raise InvalidArgument(f"malformed request message: cannot decode it ({type(e).__name__})") from None


def _wrap_unary(behavior, deserializer=None):
    async def wrapper(request, context):
        try:
            if deserializer is not None:
                request = decode(request, deserializer)
            return await behavior(request, context)
        except aio.AbortError:
            raise
        except Exception as e:  # noqa: BLE001 - this is the one place errors become statuses
            await _abort(context, e)

    return wrapper


def _wrap_stream_unary(behavior):
    async def wrapper(request_iterator, context):
        try:
            return await behavior(request_iterator, context)
        except aio.AbortError:
            raise
        except Exception as e:  # noqa: BLE001 - this is the one place errors become statuses
            await _abort(context, e)

    return wrapper


def with_error_boundary(handler: grpc.RpcMethodHandler,
                        deserializer: Callable[[bytes], object] | None = None) -> grpc.RpcMethodHandler:
    """`handler` with its errors turned into statuses (unary and stream-unary handlers; others as they are).
    A server that builds its own handlers (the router) wraps each once where it registers it, with no
    interceptor at all: an aio interceptor is a coroutine on every call (~100 us a call on the router at
    concurrency 16, bench/passthrough.py with and without one). `deserializer`: decodes a unary request's
    bytes instead of the handler's own (hostd's ModelInfer: hostd/wire_request.py)."""
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(
            _wrap_unary(handler.unary_unary, deserializer or handler.request_deserializer),
            request_deserializer=None,  # raw bytes in: decoded inside the wrapper (INVALID_ARGUMENT on failure)
            response_serializer=handler.response_serializer,
        )
    if handler.stream_unary is not None:  # reads its request itself (the router's ModelInfer: it may refuse first)
        return grpc.stream_unary_rpc_method_handler(
            _wrap_stream_unary(handler.stream_unary), request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
    return handler


class ErrorInterceptor(aio.ServerInterceptor):
    """For servers whose handlers come from generated code (hostd): wraps each unary handler once and
    reuses the wrapper; intercept_service runs on every call. `decoders`: per method ('/package.Service/Method'),
    a decoder to use instead of the generated deserializer."""

    def __init__(self, decoders: Mapping[str, Callable[[bytes], object]] | None = None) -> None:
        self._wrapped: dict[int, tuple[object, grpc.RpcMethodHandler]] = {}
        self._decoders = dict(decoders or {})

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None or (handler.unary_unary is None and handler.stream_unary is None):
            return handler
        hit = self._wrapped.get(id(handler))
        if hit is not None and hit[0] is handler:
            return hit[1]
        wrapped = with_error_boundary(handler, self._decoders.get(handler_call_details.method))
        if len(self._wrapped) > 1024:  # handlers are per method; a server that builds them per call stays bounded
            self._wrapped.clear()
        self._wrapped[id(handler)] = (handler, wrapped)  # holding `handler` keeps its id from being reused
        return wrapped
