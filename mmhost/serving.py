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
