"""What every long-running mmhost server shares: run until SIGTERM or SIGINT, then shut down gracefully."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import NoReturn

_exit = os._exit  # tests/conftest.py replaces it: in the test process it would end pytest, status 0


async def exit_after(main: Awaitable[None]) -> NoReturn:
    """Run a server's `main` (start, serve until a signal, stop), then end the process with exit_now, from
    inside the loop: asyncio.run's teardown (3.11) would join the default executor's threads without a limit,
    and a hostd whose storage hung took 97 s to exit after its 2 s drain, far past a pod's grace."""
    await main
    exit_now(0)


def exit_now(code: int = 0) -> NoReturn:
    """End a server process that has stopped: logs and stdio flushed, then os._exit, so that worker threads
    stuck in storage or Redis calls (ThreadPoolExecutor threads, joined at interpreter exit) cannot hold the
    exit up. Through exit_after, from hostd.server.serve and router.server.serve (unless told not to: mmhost demo
    stops its hostds after its in-process router), whose callers are the processes' own entry points."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    _exit(code)


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
