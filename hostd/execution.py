"""The host's execution slots: a bounded number of batches run on the device at once, and waiting batches
of all models and tenants get slots through the fair policy in hostd/sched_policy.py."""

from __future__ import annotations

import time
from collections.abc import Callable

from hostd.sched_policy import FairShare, SlotRequest


class ExecutionGate:
    def __init__(self, slots: int, weight: Callable[[str], float], clock: Callable[[], float] = time.monotonic,
                 on_wait: Callable[[str, float], None] | None = None) -> None:
        self.slots = slots
        self.free = slots
        self._weight = weight
        self._clock = clock
        self._policy = FairShare()
        self._waiting: dict[int, tuple[SlotRequest, Callable[[], None]]] = {}
        self._seq = 0
        self._on_wait = on_wait

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def request(self, tenant: str, priority: int, cost: float, on_grant: Callable[[], None]) -> int:
        """Ask for a slot; `on_grant` runs (synchronously, on the event loop) once one is granted, and the
        holder must call `release` when its batch finishes."""
        self._seq += 1
        r = SlotRequest(seq=self._seq, tenant=tenant, priority=priority, arrival=self._clock(), cost=cost)
        self._waiting[r.seq] = (r, on_grant)
        self._dispatch()
        return r.seq

    def cancel(self, seq: int) -> None:
        self._waiting.pop(seq, None)

    def release(self) -> None:
        self.free += 1
        self._dispatch()

    def _dispatch(self) -> None:
        while self.free > 0 and self._waiting:
            r = self._policy.choose([w for w, _ in self._waiting.values()])
            assert r is not None
            _, grant = self._waiting.pop(r.seq)
            self._policy.charge(r, self._weight(r.tenant))
            self.free -= 1
            if self._on_wait is not None:
                self._on_wait(r.tenant, self._clock() - r.arrival)
            grant()
        if not self._waiting:
            self._policy.forget_idle()
