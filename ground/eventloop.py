"""Which asyncio event loop a process runs: Python's own, or uvloop's (libuv, compiled).

Why (issue #13, the router's CPU per request): a grpc.aio process spends most of its loop thread in grpc.aio's
Cython and asyncio's own machinery (futures, handles, the ready queue, transports), and the router's data links
to hostds (ground/framelink.py) are asyncio streams. uvloop runs the same asyncio API in compiled code. Measured
with `python -m bench.router --small --levels 16 --no-nginx --no-fast-lane --paths "router,router asyncio"
--rounds 8` (the small model at concurrency 16, both routers in the same run, 2 shared cores, 2026-12-07): the
router's CPU per request 627 us on uvloop against 676 on asyncio's loop (mean of 8 rounds, -7%; lower in 7 of 8),
throughput 1,405 against 1,350 requests/s (higher in 7 of 8). The 50 MB model at concurrency 32 (`--levels 32`,
8 rounds): 682 against 733 us (lower in 8 of 8), throughput kept 0.80x against 0.78x of direct (within the noise).

hostd stays on asyncio's loop by default: its lone batches may run on the loop thread only right after the loop
woke from a real wait for I/O, which the loop's selector times (ground/loopidle.py); uvloop has no selector to
time, so on it that path never runs and a request at concurrency 1 pays the thread hop again.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Coroutine
from typing import Any, Literal, TypeVar

EventLoopKind = Literal["asyncio", "uvloop"]
T = TypeVar("T")


def loop_factory(kind: EventLoopKind,
                 asyncio_factory: Callable[[], asyncio.AbstractEventLoop] | None = None,
                 ) -> Callable[[], asyncio.AbstractEventLoop]:
    """For `asyncio.Runner(loop_factory=...)`: a new loop of `kind`. `asyncio_factory` makes the asyncio kind
    (hostd's loop with its timed selector); by default asyncio's own loop."""
    if kind == "uvloop":
        import uvloop  # imported only where it is used: a process on asyncio's loop never loads it

        return uvloop.new_event_loop
    if kind == "asyncio":
        return asyncio_factory or asyncio.new_event_loop
    raise ValueError(f"unknown event loop {kind!r}: asyncio or uvloop")


def run(main: Coroutine[Any, Any, T], kind: EventLoopKind,
        asyncio_factory: Callable[[], asyncio.AbstractEventLoop] | None = None) -> T:
    """asyncio.run(main) on a loop of `kind`."""
    factory = loop_factory(kind, asyncio_factory)
    if sys.version_info >= (3, 11):
        with asyncio.Runner(loop_factory=factory) as runner:
            return runner.run(main)
    return run_without_runner(main, factory)


def run_without_runner(main: Coroutine[Any, Any, T], factory: Callable[[], asyncio.AbstractEventLoop]) -> T:
    """Python 3.10's `run` (no asyncio.Runner there): what asyncio.Runner does, less its cancellation of leftover
    tasks. Public so that a test on a newer Python runs it too."""
    loop = factory()
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(main)
    finally:
        asyncio.set_event_loop(None)
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


def loop_kind(loop: asyncio.AbstractEventLoop) -> EventLoopKind:
    """Which kind `loop` is (what a process reports it runs)."""
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"
