"""The virtual clock and event heap. Events at the same time run in the order they were scheduled."""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any


class EventLoop:
    def __init__(self, start: float = 0.0) -> None:
        self.now = start
        self._heap: list[tuple[float, int, Callable[..., Any], tuple[Any, ...]]] = []
        self._seq = 0
        self.processed = 0

    def schedule(self, at: float, fn: Callable[..., Any], *args: Any) -> None:
        """Run fn(*args) at virtual time `at` (never before now)."""
        if at < self.now:
            at = self.now
        self._seq += 1
        heapq.heappush(self._heap, (at, self._seq, fn, args))

    def after(self, delay: float, fn: Callable[..., Any], *args: Any) -> None:
        self.schedule(self.now + delay, fn, *args)

    def __len__(self) -> int:
        return len(self._heap)

    def run(self, until: float | None = None) -> float:
        """Process events in time order until none are left (or the next is after `until`); return now."""
        heap = self._heap
        while heap:
            if until is not None and heap[0][0] > until:
                self.now = until
                break
            at, _, fn, args = heapq.heappop(heap)
            self.now = at
            self.processed += 1
            fn(*args)
        return self.now
