"""Fair execution across tenants, as pure code: which waiting batch gets the next execution slot.

Start-time fair queuing (SFQ) by tenant weight: each tenant has a virtual finish time; a batch's start tag
is max(virtual time, its tenant's finish), and the smallest start tag goes next; serving a batch of
estimated cost c moves its tenant's finish to start + c / weight. A tenant flooding the device gets its
weighted share and no more; a quiet tenant's batch starts at the current virtual time, so it waits behind
at most one batch per slot already granted to others. Within a tenant, priority level 1 goes first (Triton
semantics), then arrival order.

No clock, no I/O: hostd/core/slots.py drives this code, for hostd and sim/ alike. State is the plain fields of FairShare.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class SlotRequest:
    seq: int
    tenant: str
    priority: int = 1  # 1 is highest
    arrival: float = 0.0
    cost: float = 0.001  # estimated seconds of device time for the batch


@dataclass
class FairShare:
    vtime: float = 0.0
    finish: dict[str, float] = field(default_factory=dict)

    def start_tag(self, tenant: str) -> float:
        return max(self.vtime, self.finish.get(tenant, 0.0))

    def choose(self, waiting: Iterable[SlotRequest]) -> SlotRequest | None:
        """The request to grant next (not yet charged): the head of the tenant with the smallest start tag."""
        heads: dict[str, SlotRequest] = {}
        for r in waiting:
            h = heads.get(r.tenant)
            if h is None or (r.priority, r.arrival, r.seq) < (h.priority, h.arrival, h.seq):
                heads[r.tenant] = r
        if not heads:
            return None
        return min(heads.values(), key=lambda r: (self.start_tag(r.tenant), r.arrival, r.seq))

    def charge(self, r: SlotRequest, weight: float = 1.0) -> None:
        """Account a granted request: the tenant's finish moves by cost / weight."""
        start = self.start_tag(r.tenant)
        self.finish[r.tenant] = start + r.cost / max(weight, 1e-9)
        self.vtime = start

    def forget_idle(self) -> None:
        """Drop tenants whose finish is in the virtual past: they start fresh at vtime anyway."""
        self.finish = {t: f for t, f in self.finish.items() if f > self.vtime}
