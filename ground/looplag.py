"""How late the event loop runs what is due: a coroutine sleeps `interval_s` and records how much longer than
that it took to resume. Every request's callbacks wait in the same first-in, first-out queue of ready
callbacks, so this lag is what any request waits, per loop turn, behind the others' work (and behind the CPU
the process gets). On a host saturated by one model it is the other models' latency that no queue or slot
statistic shows (issue #15: the light model's queue time 0.02 ms, its clients' p99 20 ms)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

LAG_BUCKETS = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
INTERVAL_S = 0.05  # 20 samples a second: a few microseconds of the loop's time


async def watch_loop_lag(observe: Callable[[float], None], interval_s: float = INTERVAL_S,
                         clock: Callable[[], float] = time.perf_counter,
                         sleep: Callable[[float], Awaitable[object]] = asyncio.sleep) -> None:
    """Forever: `observe(seconds late)` once per interval (cancel the task to stop). `clock` and `sleep`: a
    virtual pair in tests."""
    while True:
        t0 = clock()
        await sleep(interval_s)
        observe(max(0.0, clock() - t0 - interval_s))
