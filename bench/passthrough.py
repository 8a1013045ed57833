"""The floor of a Python gRPC proxy: a grpc.aio server that forwards every unary call's bytes to one upstream
over one grpc.aio channel, with no logic at all (no auth, no parse, no metrics, no log). bench/router.py runs
it beside the router to say how far above what grpc.aio itself costs the router is.

    python -m bench.passthrough LISTEN UPSTREAM [--read-in-handler | --echo]

--read-in-handler: the body read by the handler (stream-unary and context.read(), as the router's ModelInfer
does to refuse before a body arrives) instead of handed to it (unary): what that choice costs by itself.
--echo: ModelInfer answered at once with an empty ModelInferResponse, upstream never called (other methods,
health among them, still go upstream): the CPU per request of answering a call at all on grpc.aio, the floor
of any Python gRPC front end, router or hostd."""

from __future__ import annotations

import asyncio
import sys

import grpc
from grpc import aio


class _Forward(grpc.GenericRpcHandler):
    def __init__(self, channel: aio.Channel, read_in_handler: bool = False, echo: bool = False) -> None:
        self.channel = channel
        self.read_in_handler = read_in_handler  # stream-unary + context.read(), as the router's ModelInfer
        self.echo = echo
        self.calls: dict[str, aio.UnaryUnaryMultiCallable] = {}

    def service(self, details):
        method = details.method
        if self.echo and method.endswith("/ModelInfer"):
            async def answer(body: bytes, context) -> bytes:
                return b""  # an empty ModelInferResponse

            return grpc.unary_unary_rpc_method_handler(answer)
        call = self.calls.get(method)
        if call is None:
            call = self.calls[method] = self.channel.unary_unary(method)

        if self.read_in_handler:
            async def reader(request_iterator, context) -> bytes:
                body = await context.read()
                return await call(body, timeout=context.time_remaining())

            return grpc.stream_unary_rpc_method_handler(reader)

        async def handler(body: bytes, context) -> bytes:
            return await call(body, timeout=context.time_remaining())

        return grpc.unary_unary_rpc_method_handler(handler)


async def serve(listen: str, upstream: str, read_in_handler: bool = False, echo: bool = False) -> None:
    big = [("grpc.max_send_message_length", 256 << 20), ("grpc.max_receive_message_length", 256 << 20)]
    channel = aio.insecure_channel(upstream, options=big)
    server = aio.server(options=big)
    server.add_generic_rpc_handlers((_Forward(channel, read_in_handler, echo),))
    server.add_insecure_port(listen)
    await server.start()
    await server.wait_for_termination()


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1], sys.argv[2], "--read-in-handler" in sys.argv[3:], "--echo" in sys.argv[3:]))
