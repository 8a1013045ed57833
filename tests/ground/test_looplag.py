"""The event-loop lag watch: what it records on a virtual clock (exactly how late each resume was, never less
than nothing), and on a real loop that a callback holds (the hold, seen)."""

from __future__ import annotations

import asyncio
import time

import pytest

from ground.looplag import watch_loop_lag


def test_each_sample_is_how_late_the_resume_came_and_never_negative():
    now = [0.0]
    late = iter([0.0, 0.030, 0.002, -0.001])  # on time, held 30 ms, 2 ms, a clock that resumed early
    seen: list[float] = []

    async def sleep(s: float) -> None:
        try:
            now[0] += s + next(late)
        except StopIteration:
            raise asyncio.CancelledError from None

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(watch_loop_lag(seen.append, interval_s=0.05, clock=lambda: now[0], sleep=sleep))
    assert seen == pytest.approx([0.0, 0.030, 0.002, 0.0])


async def _held(hold_s: float) -> list[float]:
    seen: list[float] = []
    task = asyncio.get_running_loop().create_task(watch_loop_lag(seen.append, interval_s=0.01))
    await asyncio.sleep(0.02)
    before = len(seen)
    asyncio.get_running_loop().call_soon(time.sleep, hold_s)  # a callback that holds the loop
    while len(seen) < before + 2:  # polls until the sample across the hold and one after it came in
        await asyncio.sleep(0.01)
    task.cancel()
    return seen[before:]


def test_a_real_loop_held_by_a_callback_shows_the_hold_as_lag():
    lags = asyncio.run(_held(0.08))
    assert max(lags) >= 0.06, lags  # the sample due during the 80 ms hold ran that much late
