"""The host's execution slots: at most `slots` batches run on the device at once, and waiting batches of
all models and tenants get slots in the fair order of hostd.sched_policy.FairShare (weighted by tenant,
then, unit "model", shared by a tenant's models).

One model holds at most `per_model` slots (hostd.sched_policy.per_model_cap: by default all but one), so a
model whose work arrives while another model saturates the host finds a slot free: batches are not
preempted, and without that reservation it would wait for a running batch to end.

Plan/commit style, no callbacks and no clock: `request(...)` queues a request and returns its token;
`grant()` hands out free slots and returns the granted requests (the shell starts their batches);
`release(model)` frees a slot when a batch finishes. core/dispatch.py drives it, for hostd and sim/ alike.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

from hostd.sched_policy import FairShare, FairUnit, SlotRequest, per_model_cap


def _unit_weight(tenant: str) -> float:
    return 1.0


class ExecutionSlots:
    def __init__(self, slots: float, weight: Callable[[str], float] = _unit_weight, *, per_model: int = 0,
                 unit: FairUnit = "tenant") -> None:
        """`slots`: concurrent batches on the host (math.inf: no host-wide limit). `per_model`: slots one
        model may hold (0 = auto, sched_policy.per_model_cap). `unit`: the fairness unit (sched_policy)."""
        self.slots = slots
        self.free = slots
        self.weight = weight
        self.cap = per_model_cap(slots, per_model)
        self.policy = FairShare(unit=unit)
        self._waiting: dict[int, SlotRequest] = {}
        self._held: dict[Hashable, int] = {}  # model -> slots it holds
        self._seq = 0

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def held(self, model: Hashable) -> int:
        return self._held.get(model, 0)

    def request(self, tenant: str, priority: int, cost: float, now: float, model: Hashable = None) -> int:
        """Ask for a slot for one batch (estimated `cost` seconds) of `model`; returns a token for `cancel`."""
        self._seq += 1
        self._waiting[self._seq] = SlotRequest(self._seq, tenant, priority, now, cost, model)
        return self._seq

    def cancel(self, token: int) -> bool:
        return self._waiting.pop(token, None) is not None

    def grant(self) -> list[SlotRequest]:
        """Hand out free slots in fair order, to models under their cap; each granted request holds a slot
        until `release`."""
        out: list[SlotRequest] = []
        waiting, held, cap = self._waiting, self._held, self.cap
        while self.free > 0 and waiting:
            if cap < self.slots:
                r = self.policy.choose(w for w in waiting.values() if held.get(w.model, 0) < cap)
                if r is None:  # every waiting model is at its cap: the free slots stay for other models
                    break
            else:
                r = self.policy.choose(waiting.values())
                assert r is not None
            del waiting[r.seq]
            self.policy.charge(r, self.weight(r.tenant))
            self.free -= 1
            held[r.model] = held.get(r.model, 0) + 1
            out.append(r)
        if not waiting:
            self.policy.forget_idle()
        return out

    def borrow(self, model: Hashable = None) -> int:
        """Every free slot to `model`, for the batch it runs alone on the host (core/dispatch.py: a wide
        batch); returns how many; each goes back with a `release`."""
        n = int(self.free) if self.free != float("inf") else 0
        if n > 0:
            self.free -= n
            self._held[model] = self._held.get(model, 0) + n
        return n

    def release(self, model: Hashable = None) -> None:
        """A batch of `model` finished (or its granted slot was not used): the slot is free again."""
        self.free += 1
        n = self._held.get(model, 0) - 1
        if n > 0:
            self._held[model] = n
        else:
            self._held.pop(model, None)
