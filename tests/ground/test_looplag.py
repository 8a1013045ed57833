"""The event-loop lag watch: a loop held by a callback shows that callback's length as lag; a free one shows
next to none."""

from __future__ import annotations

import asyncio
import time

from ground.looplag import watch_loop_lag


async def _watch(hold_s: float) -> list[float]:
    seen: list[float] = []
    task = asyncio.get_running_loop().create_task(watch_loop_lag(seen.append, interval_s=0.01))
    await asyncio.sleep(0.035)  # a few free turns first
    free = len(seen)
    if hold_s:
        asyncio.get_running_loop().call_soon(time.sleep, hold_s)  # a callback that holds the loop
    await asyncio.sleep(0.05 + hold_s)
    task.cancel()
    return seen[free:] if hold_s else seen


def test_a_held_loop_shows_the_hold_as_lag():
    lags = asyncio.run(_watch(0.08))
    assert max(lags) >= 0.06, lags  # the sample due during the 80 ms hold ran that much late


def test_a_free_loop_shows_little_lag():
    lags = asyncio.run(_watch(0.0))
    assert len(lags) >= 2 and all(lag >= 0 for lag in lags)
    assert min(lags) < 0.01, lags  # a shared machine may delay one sample, not every one
