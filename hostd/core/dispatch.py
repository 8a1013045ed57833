"""A host's batch dispatch: every model's queue (core/queue.py) and the host's execution slots
(core/slots.py), tied together. This is the loop both shells used to write around the batch policy:
plan a model's queue; a batch that may run asks for a slot (for its model: the slots keep one free for other
models, and share by tenant, then model); when a slot is granted, the batch is formed then (it may have grown
while waiting) and started; a finished batch frees its executor and its slot.

A wide batch: a batch of one request of a model that can run wide, started while no other batch runs on
the host, no model waits for a slot and no request waits in its own queue (requests queued behind it mean
the event loop is busy taking them in, and would lose its core to a wide batch), and estimated by the cost
function at `wide_max_s` or less, also borrows every free slot until it finishes; the shell runs it on every
core (hostd: a second session of the model, hostd/core/sizing.py). So the slots still bound the cores in
use, and another model's work that arrives meanwhile waits for that one short batch.

Plan -> execute -> commit: `kick` and `finish` return a Step (batches started, requests expired or
rejected, when to plan again, slot waits); the shell executes it (hostd: worker threads and futures; sim:
the cost model on the virtual clock) and calls `finish` when a batch is done. No clock: pass `now`.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

from hostd.batch_policy import BatchDecision
from hostd.core.queue import ModelQueue
from hostd.core.slots import ExecutionSlots

Cost = Callable[[Hashable, int], float]  # (model, requests in the batch) -> estimated seconds


@dataclass
class Step:
    started: list[tuple[Hashable, tuple[int, ...]]] = field(default_factory=list)  # (model, seqs): run these
    expired: list[tuple[Hashable, int]] = field(default_factory=list)  # (model, seq): deadline passed
    rejected: list[tuple[Hashable, int]] = field(default_factory=list)  # (model, seq): queue timeout passed
    wake: dict[Hashable, float] = field(default_factory=dict)  # model -> plan it again at this time
    waits: list[tuple[str, float]] = field(default_factory=list)  # (tenant, seconds waited for a slot)
    wide: dict[Hashable, tuple[int, ...]] = field(default_factory=dict)  # model -> its started batch to run wide


@dataclass
class _Entry:
    queue: ModelQueue
    tenant: str
    asking: int | None = None  # the slot request in flight
    removed: bool = False  # left the host; kept until its running batches finish
    wide: bool = False  # its lone batches of one request may run wide


class Dispatcher:
    def __init__(self, slots: ExecutionSlots, cost: Cost, wide_max_s: float = 0.0) -> None:
        """`wide_max_s`: the longest estimated batch that may run wide (0: none)."""
        self.slots = slots
        self._cost = cost
        self._wide_max_s = wide_max_s
        self._models: dict[Hashable, _Entry] = {}
        self._asking: dict[int, Hashable] = {}  # slot token -> model
        self._borrowed: tuple[Hashable, int] | None = None  # the running wide batch's model, extra slots

    def add(self, model: Hashable, queue: ModelQueue, tenant: str, wide: bool = False) -> None:
        """`wide`: the model's lone batches of one request may run wide (its shell can run them so)."""
        self._models[model] = _Entry(queue, tenant, wide=wide)

    def remove(self, model: Hashable) -> None:
        """The model leaves (unloaded): its slot request, if any, is withdrawn; nothing more starts for it,
        and its running batches still `finish`."""
        e = self._models.get(model)
        if e is None:
            return
        if e.asking is not None:
            self.slots.cancel(e.asking)
            self._asking.pop(e.asking, None)
            e.asking = None
        e.removed = True
        if e.queue.inflight == 0:
            del self._models[model]

    def kick(self, model: Hashable, now: float) -> Step:
        """Something changed for the model (a request arrived, a timer fired): start what can start."""
        step = Step()
        self._kick(model, now, step)
        return step

    def finish(self, model: Hashable, requests: int, now: float) -> Step:
        """A batch of `requests` finished: free its executor and its slot, then start what can start."""
        step = Step()
        e = self._models[model]
        e.queue.finish(requests)
        if e.removed and e.queue.inflight == 0:
            del self._models[model]
        self.slots.release(model)
        if self._borrowed is not None and self._borrowed[0] == model:  # while it ran, nothing else did
            for _ in range(self._borrowed[1]):
                self.slots.release(model)
            self._borrowed = None
        self._grant(now, step)
        self._kick(model, now, step)
        return step

    def _plan(self, model: Hashable, q: ModelQueue, now: float, step: Step) -> BatchDecision:
        d = q.plan(now)
        step.expired.extend((model, s) for s in d.expired)
        step.rejected.extend((model, s) for s in d.rejected)
        return d

    def _kick(self, model: Hashable, now: float, step: Step) -> None:
        e = self._models.get(model)
        if e is None or e.removed:
            return
        q = e.queue
        while q.pending and q.free > 0 and e.asking is None:
            d = self._plan(model, q, now, step)
            if not d.run:
                if d.wake_at is not None:
                    step.wake[model] = d.wake_at
                break
            token = self.slots.request(e.tenant, q.pending[d.run[0]].priority, self._cost(model, len(d.run)), now,
                                       model)
            e.asking = token
            self._asking[token] = model
            self._grant(now, step, (token, d))

    def _grant(self, now: float, step: Step, planned: tuple[int, BatchDecision] | None = None) -> None:
        """Hand out free slots. `planned`: a request made just now with its plan, still valid if granted."""
        granted = []
        for r in self.slots.grant():
            d = planned[1] if planned is not None and r.seq == planned[0] else None
            granted.append((self._asking.pop(r.seq), d))
            step.waits.append((r.tenant, now - r.arrival))
        for model, d in granted:
            self._granted(model, now, step, d)
        for model, _ in granted:
            self._kick(model, now, step)

    def _granted(self, model: Hashable, now: float, step: Step, d: BatchDecision | None = None) -> None:
        """A slot for the model: form its batch now (or take `d`, planned at this instant) and start it, or
        give the slot back."""
        e = self._models[model]
        e.asking = None
        q = e.queue
        if d is None:
            d = self._plan(model, q, now, step) if (q.pending and q.free > 0) else None
        if d is None or not d.run:
            self.slots.release(model)  # nothing to run after all (expired, cancelled, or waiting to fill)
            self._grant(now, step)
            return
        q.start(d.run)
        step.started.append((model, d.run))
        if self._wide_max_s > 0 and e.wide and len(d.run) == 1 and not q.pending and self._alone() \
                and self._cost(model, 1) <= self._wide_max_s:
            self._borrowed = (model, self.slots.borrow(model))
            step.wide[model] = d.run

    def _alone(self) -> bool:
        """The batch just granted is the only one running on the host (it holds the one slot taken), and no
        model waits for a slot."""
        s = self.slots
        return s.slots != float("inf") and s.slots >= 2 and s.free == s.slots - 1 and not s.waiting
