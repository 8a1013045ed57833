"""The asyncio shell over the host's execution slots (hostd/core/slots.py): a batch that may run asks for a
slot with a callback, which runs on the event loop once the core grants it; slot waits go to a metric."""

from __future__ import annotations

import time
from collections.abc import Callable

from hostd.core.slots import ExecutionSlots


class ExecutionGate:
    def __init__(self, slots: int, weight: Callable[[str], float], clock: Callable[[], float] = time.monotonic,
                 on_wait: Callable[[str, float], None] | None = None) -> None:
        self.core = ExecutionSlots(slots, weight)
        self._clock = clock
        self._on_grant: dict[int, Callable[[], None]] = {}
        self._on_wait = on_wait

    @property
    def slots(self) -> int:
        return int(self.core.slots)

    @property
    def free(self) -> int:
        return int(self.core.free)

    @property
    def waiting(self) -> int:
        return self.core.waiting

    def request(self, tenant: str, priority: int, cost: float, on_grant: Callable[[], None]) -> int:
        """Ask for a slot; `on_grant` runs (synchronously, on the event loop) once one is granted, and the
        holder must call `release` when its batch finishes."""
        token = self.core.request(tenant, priority, cost, self._clock())
        self._on_grant[token] = on_grant
        self._dispatch()
        return token

    def cancel(self, token: int) -> None:
        self.core.cancel(token)
        self._on_grant.pop(token, None)

    def release(self) -> None:
        self.core.release()
        self._dispatch()

    def _dispatch(self) -> None:
        for r in self.core.grant():
            grant = self._on_grant.pop(r.seq)
            if self._on_wait is not None:
                self._on_wait(r.tenant, self._clock() - r.arrival)
            grant()
