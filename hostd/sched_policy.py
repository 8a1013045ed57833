"""Fair execution across tenants, then across a tenant's models, as pure code: which waiting batch gets
the next execution slot.

Start-time fair queuing (SFQ) by tenant weight: each tenant has a virtual finish time; a batch's start tag
is max(virtual time, its tenant's finish), and the smallest start tag goes next; serving a batch of
estimated cost c moves its tenant's finish to start + c / weight. A tenant flooding the device gets its
weighted share and no more; a quiet tenant's batch starts at the current virtual time, so it waits behind
at most one batch per slot already granted to others.

The fairness unit (`unit`) says what shares a tenant's slots:
- "tenant": within a tenant, priority level 1 goes first (Triton semantics), then arrival order. A
  tenant's own hot model can keep its quiet models waiting behind its backlog.
- "model" (hostd's default): within a tenant, priority level 1 first, then the same SFQ one level down,
  over the tenant's models with equal weights (each tenant keeps its own model virtual time). A tenant's
  quiet model waits behind at most one batch per slot of its hot model, as a quiet tenant does.

No clock, no I/O: hostd/core/slots.py drives this code, for hostd and sim/ alike. State is the plain fields of FairShare.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Literal

FairUnit = Literal["tenant", "model"]
FAIR_UNITS: tuple[FairUnit, ...] = ("tenant", "model")


@dataclass(frozen=True, slots=True)
class SlotRequest:
    seq: int
    tenant: str
    priority: int = 1  # 1 is highest
    arrival: float = 0.0
    cost: float = 0.001  # estimated seconds of device time for the batch
    model: Hashable = None  # the model asking (unit "model": a tenant's models share its slots fairly)


@dataclass
class FairShare:
    unit: FairUnit = "tenant"
    vtime: float = 0.0
    finish: dict[str, float] = field(default_factory=dict)
    model_vtime: dict[str, float] = field(default_factory=dict)  # tenant -> virtual time among its models
    model_finish: dict[tuple[str, Hashable], float] = field(default_factory=dict)  # (tenant, model) -> finish

    def start_tag(self, tenant: str) -> float:
        return max(self.vtime, self.finish.get(tenant, 0.0))

    def model_tag(self, tenant: str, model: Hashable) -> float:
        return max(self.model_vtime.get(tenant, 0.0), self.model_finish.get((tenant, model), 0.0))

    def _within(self, r: SlotRequest) -> tuple:
        """Order inside one tenant: priority, then (unit "model") the model's start tag, then arrival."""
        if self.unit == "model":
            return (r.priority, self.model_tag(r.tenant, r.model), r.arrival, r.seq)
        return (r.priority, r.arrival, r.seq)

    def choose(self, waiting: Iterable[SlotRequest]) -> SlotRequest | None:
        """The request to grant next (not yet charged): the head of the tenant with the smallest start tag."""
        heads: dict[str, tuple[tuple, SlotRequest]] = {}
        within = self._within
        for r in waiting:
            h = heads.get(r.tenant)
            k = within(r)
            if h is None or k < h[0]:
                heads[r.tenant] = (k, r)
        if not heads:
            return None
        return min((r for _, r in heads.values()), key=lambda r: (self.start_tag(r.tenant), r.arrival, r.seq))

    def charge(self, r: SlotRequest, weight: float = 1.0) -> None:
        """Account a granted request: the tenant's finish moves by cost / weight (and, unit "model", the
        model's finish within its tenant by cost)."""
        start = self.start_tag(r.tenant)
        self.finish[r.tenant] = start + r.cost / max(weight, 1e-9)
        self.vtime = start
        if self.unit == "model":
            mstart = self.model_tag(r.tenant, r.model)
            self.model_finish[(r.tenant, r.model)] = mstart + r.cost
            self.model_vtime[r.tenant] = mstart

    def forget_idle(self) -> None:
        """Drop tenants (and models) whose finish is in the virtual past: they start fresh at vtime anyway."""
        self.finish = {t: f for t, f in self.finish.items() if f > self.vtime}
        if self.model_finish:
            mv = self.model_vtime
            self.model_finish = {k: f for k, f in self.model_finish.items() if f > mv.get(k[0], 0.0)}


def per_model_cap(slots: float, setting: int = 0) -> float:
    """Slots one model may hold at once. `setting` 0 = auto: all but one when the host has 2 or more, so a
    model with work never finds every slot held by another model (batches are not preempted: the only way
    to start at once is a slot kept free); one slot (or no host limit) cannot be split."""
    if setting > 0:
        return min(float(setting), slots)
    return slots - 1 if 2 <= slots < float("inf") else slots
