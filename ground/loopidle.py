"""Whether the event loop had nothing to do just now: a selector that notes when its loop last woke from a
real wait for I/O, and the rule that asks it.

Why (issue #13, concurrency 1): hostd runs a lone batch of one request on a worker thread (hostd/batcher.py),
and the two thread wake-ups, loop to worker and back, cost ~0.4 ms of a ~3 ms request on a 2-core VM. Running
that batch on the loop thread saves them, but only while no other request is on its way in: grpc.aio takes
in one new call per turn of the loop (its server awaits one `request_call` at a time, each completed through
its poller thread), so a request that arrives while the loop computes waits inside gRPC, unseen, and reaches
an idle host alone again once the loop is free. Counting calls in flight cannot see that backlog: with lone
batches on the loop at concurrency 32, hostd's data plane never held more than one call, every batch was a
batch of one, and throughput fell from ~1,500 to ~400 requests/s (measured; not kept).

What does see it: a backlog leaves the loop something to do. After a batch on the loop, the gRPC core's
notification of the next call is already waiting, so the loop's next wait for I/O returns at once. At
concurrency 1 the loop waits for the client's next call, as long as the client's own turnaround takes. So a
batch may run on the loop only when the loop woke from a wait of at least `idle_min_s` within the last
`fresh_s`, and only once per such wake: one batch on the loop per idle spell, never a chain.

Pure rule (`LoopIdle`, times passed in) plus the selector that feeds it (`IdleSelector`, for
`asyncio.Runner(loop_factory=...)`); a loop without it never reports idle, so nothing runs on it.
"""

from __future__ import annotations

import asyncio
import selectors
import time
from collections.abc import Callable

# A wait this long is the loop idle, not a hand-off (the gRPC poller thread's notification of a call already
# queued). Measured with these two values on the 2-core box (a throwaway counter, bench/batching.py's model
# and client): 1,794 of 1,800 lone requests at concurrency 1 ran on the loop, and concurrency 32 kept its
# batches (bench/batching.py --variant, docs/execution.md).
IDLE_MIN_S = 0.0002
# From that wake to the batch's start: the request's own decode, resolve and queueing (~0.2 ms).
FRESH_S = 0.001


class LoopIdle:
    """The loop's last wake from a real wait, and whether a batch may use it."""

    def __init__(self, idle_min_s: float = IDLE_MIN_S, fresh_s: float = FRESH_S) -> None:
        self.idle_min_s = idle_min_s
        self.fresh_s = fresh_s
        self._woke = -float("inf")  # when the loop last woke from waiting idle_min_s or longer
        self._taken = -float("inf")  # when a batch last took such a wake

    def waited(self, started: float, ended: float) -> None:
        """The loop waited for I/O from `started` to `ended` (its selector's clock)."""
        if ended - started >= self.idle_min_s:
            self._woke = ended

    def take(self, now: float) -> bool:
        """True, once per wake: the loop woke from idle within `fresh_s` and no batch has used that wake."""
        if self._woke > self._taken and now - self._woke <= self.fresh_s:
            self._taken = now
            return True
        return False


class IdleSelector(selectors.DefaultSelector):
    """The platform's default selector, timing each wait for `LoopIdle` on `clock` (the one `take` is asked on)."""

    def __init__(self, idle: LoopIdle, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._idle = idle
        self._clock = clock

    def select(self, timeout: float | None = None):
        if timeout is not None and timeout <= 0:  # a poll: the loop has work ready, so it is not idle
            return super().select(timeout)
        t0 = self._clock()
        events = super().select(timeout)
        self._idle.waited(t0, self._clock())
        return events


def idle_loop_factory(idle: LoopIdle, clock: Callable[[], float] = time.monotonic) -> Callable[[], asyncio.AbstractEventLoop]:
    """For `asyncio.Runner(loop_factory=...)`: an event loop whose waits feed `idle`."""
    return lambda: asyncio.SelectorEventLoop(IdleSelector(idle, clock))
