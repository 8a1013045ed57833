"""One model's queue over the batch policy and the host's execution slots over the fair policy, on a
virtual clock."""

from __future__ import annotations

from hostd.batch_policy import BatchConfig, Pending
from hostd.core.queue import ModelQueue
from hostd.core.slots import ExecutionSlots


def test_queue_plan_start_finish():
    q = ModelQueue(BatchConfig(max_batch_size=4), executors=1, max_size=3)
    for i in range(3):
        q.add(Pending(seq=i, arrival=0.0))
    assert q.full and q.busy
    d = q.plan(now=0.0)
    assert d.run == (0, 1, 2) and len(q) == 3  # planned, still queued until started
    q.start(d.run)
    assert (len(q), q.free, q.inflight, q.running) == (0, 0, 1, 3)
    q.add(Pending(seq=3, arrival=0.1))
    assert q.plan(now=0.1).run == ()  # no free executor: the batch grows meanwhile
    q.finish(3)
    assert q.plan(now=0.2).run == (3,)


def test_queue_drops_expired_and_rejected_at_plan():
    q = ModelQueue(BatchConfig(max_batch_size=4), executors=1)
    q.add(Pending(seq=1, arrival=0.0, deadline=1.0))
    q.add(Pending(seq=2, arrival=0.0, queue_timeout_at=1.0))
    q.add(Pending(seq=3, arrival=0.0))
    d = q.plan(now=2.0)
    assert (d.expired, d.rejected, d.run) == ((1,), (2,), (3,))
    assert list(q.pending) == [3]


def test_queue_wakes_at_the_delay_on_a_virtual_clock():
    # the wake time is the exact sum the policy compares against: waking at it runs the batch
    q = ModelQueue(BatchConfig(max_batch_size=8, max_queue_delay=0.1), executors=1)
    q.add(Pending(seq=1, arrival=0.7))
    d = q.plan(now=0.7)
    assert d.run == () and d.wake_at is not None
    assert q.plan(now=d.wake_at).run == (1,)


def test_slots_fair_order_across_tenants():
    slots = ExecutionSlots(1)
    for i in range(5):
        slots.request("noisy", 1, 1.0, now=float(i))
    slots.request("quiet", 1, 1.0, now=10.0)
    order = []
    while slots.waiting:
        (g,) = slots.grant()
        order.append(g.tenant)
        assert slots.grant() == []  # one slot: nothing more until released
        slots.release()
    # the quiet tenant waits behind at most one noisy batch per slot, not the whole noisy backlog
    assert order.index("quiet") <= 2


def test_slots_weight_and_priority():
    slots = ExecutionSlots(1, weight=lambda t: {"gold": 3.0}.get(t, 1.0))
    slots.request("t", 2, 1.0, now=0.0)
    urgent = slots.request("t", 1, 1.0, now=1.0)
    (g,) = slots.grant()
    assert g.seq == urgent  # priority 1 first within a tenant
    slots.release()
    slots.cancel(slots.request("x", 1, 1.0, now=2.0))
    assert [r.tenant for r in slots.grant()] == ["t"]


def test_slots_without_a_host_limit_grant_everything():
    slots = ExecutionSlots(float("inf"))
    for _ in range(10):
        slots.request("t", 1, 0.1, now=0.0)
    assert len(slots.grant()) == 10


def test_one_model_never_holds_every_slot():
    slots = ExecutionSlots(2)  # auto cap: all but one
    for _ in range(4):
        slots.request("t", 1, 1.0, now=0.0, model="noisy")
    assert [g.model for g in slots.grant()] == ["noisy"]  # one slot stays free while noisy has work
    slots.request("t", 1, 1.0, now=0.1, model="light")
    assert [g.model for g in slots.grant()] == ["light"]  # light starts at once, no batch to wait for
    slots.release("noisy")
    assert [g.model for g in slots.grant()] == ["noisy"]
    assert slots.held("noisy") == 1 and slots.held("light") == 1
    full = ExecutionSlots(2, per_model=2)  # the operator's choice: a model may take every slot
    for _ in range(3):
        full.request("t", 1, 1.0, now=0.0, model="noisy")
    assert len(full.grant()) == 2
