"""What every long-running mmhost server shares: run until SIGTERM or SIGINT, then shut down gracefully."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable


async def run_until_signal(start: Callable[[], Awaitable[None]], stop: Callable[[], Awaitable[None]]) -> None:
    await start()
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    await stopping.wait()
    await stop()


def wait_serving(addr: str, proc, what: str = "server", log: Callable[[], str] = lambda: "",
                 timeout: float = 60.0) -> None:
    """Poll grpc.health.v1 at `addr` until SERVING. RuntimeError (with the log) if `proc` exits first,
    TimeoutError if it is not serving in time. For the processes `mmhost demo`, benches and tests start."""
    import time

    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(addr) as ch:
        health = health_pb2_grpc.HealthStub(ch)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{what} on {addr} exited with {proc.returncode}:\n{log()}")
            try:
                if health.Check(health_pb2.HealthCheckRequest(), timeout=1).status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.05)
    raise TimeoutError(f"{what} on {addr} not serving after {timeout:.0f}s:\n{log()}")
