"""What every long-running mmhost server shares: run until SIGTERM or SIGINT, then shut down gracefully."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, NoReturn

# After a server's own stop has run, how long its leftover tasks get to finish being cancelled.
CANCEL_WAIT_S = 2.0
_exit = os._exit  # tests/conftest.py replaces it: in the test process it would end pytest, status 0


def run_server(main: Coroutine[Any, Any, None]) -> None:
    """asyncio.run(main), less its unbounded wait at the end for the default executor's threads.

    Once a server has stopped (drained, listeners closed), a worker thread still inside a blocking call (a
    storage read with its retries, a Redis call) has no one to answer. asyncio.run (3.11) joins those threads
    without a limit: a hostd whose storage hangs took 97 s to exit after its 2 s drain, far past a pod's
    termination grace. Here leftover tasks get CANCEL_WAIT_S to finish being cancelled and the executor is
    shut down without waiting; `exit_now` then ends the process without the interpreter's own join of them."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        loop.run_until_complete(main)
    finally:
        try:
            tasks = asyncio.all_tasks(loop)
            for t in tasks:
                t.cancel()
            if tasks:
                loop.run_until_complete(asyncio.wait(tasks, timeout=CANCEL_WAIT_S))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            asyncio.set_event_loop(None)
            loop.close()  # shuts the default executor down without waiting for its threads


def exit_now(code: int = 0) -> NoReturn:
    """End a server process that has stopped: logs and stdio flushed, then os._exit, so that worker threads
    stuck in storage or Redis calls (ThreadPoolExecutor threads, joined at interpreter exit) cannot hold the
    exit up. Called by hostd.server.serve and router.server.serve (unless told not to: mmhost demo stops its
    hostds after its in-process router), whose callers are the processes' own entry points."""
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
