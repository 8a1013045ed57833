"""The host's execution slots: at most `slots` batches run on the device at once, and waiting batches of
all models and tenants get slots in the fair order of hostd.sched_policy.FairShare (weighted by tenant).

Plan/commit style, no callbacks and no clock: `request(...)` queues a request and returns its token;
`grant()` hands out free slots and returns the granted requests (the shell starts their batches);
`release()` frees a slot when a batch finishes. core/dispatch.py drives it, for hostd and sim/ alike.
"""

from __future__ import annotations

from collections.abc import Callable

from hostd.sched_policy import FairShare, SlotRequest


def _unit_weight(tenant: str) -> float:
    return 1.0


class ExecutionSlots:
    def __init__(self, slots: float, weight: Callable[[str], float] = _unit_weight) -> None:
        """`slots`: concurrent batches on the host (math.inf: no host-wide limit)."""
        self.slots = slots
        self.free = slots
        self.weight = weight
        self.policy = FairShare()
        self._waiting: dict[int, SlotRequest] = {}
        self._seq = 0

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def request(self, tenant: str, priority: int, cost: float, now: float) -> int:
        """Ask for a slot for one batch (estimated `cost` seconds); returns a token for `cancel`."""
        self._seq += 1
        self._waiting[self._seq] = SlotRequest(seq=self._seq, tenant=tenant, priority=priority, arrival=now, cost=cost)
        return self._seq

    def cancel(self, token: int) -> bool:
        return self._waiting.pop(token, None) is not None

    def grant(self) -> list[SlotRequest]:
        """Hand out free slots in fair order; each granted request holds a slot until `release`."""
        out: list[SlotRequest] = []
        waiting = self._waiting
        while self.free > 0 and waiting:
            r = self.policy.choose(waiting.values())
            assert r is not None
            del waiting[r.seq]
            self.policy.charge(r, self.weight(r.tenant))
            self.free -= 1
            out.append(r)
        if not waiting:
            self.policy.forget_idle()
        return out

    def release(self) -> None:
        self.free += 1
