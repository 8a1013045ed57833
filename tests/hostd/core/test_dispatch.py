"""A host's batch dispatch (queues + execution slots) on a virtual clock: fair order across tenants,
priority, batches formed when the slot is granted, and a model leaving while its batch runs."""

from __future__ import annotations

from hostd.batch_policy import BatchConfig, Pending
from hostd.core.dispatch import Dispatcher
from hostd.core.queue import ModelQueue
from hostd.core.slots import ExecutionSlots


def _host(slots: int = 1, mbs: int = 1) -> tuple[Dispatcher, dict[str, ModelQueue]]:
    d = Dispatcher(ExecutionSlots(slots), cost=lambda model, n: 1.0)
    queues = {}
    for model, tenant, executors in (("noisy-m", "noisy", 4), ("quiet-m", "quiet", 1)):
        queues[model] = ModelQueue(BatchConfig(max_batch_size=mbs), executors)
        d.add(model, queues[model], tenant)
    return d, queues


def test_one_slot_is_shared_fairly_across_tenants():
    d, q = _host()
    for i in range(20):
        q["noisy-m"].add(Pending(seq=i, arrival=0.0))
    step = d.kick("noisy-m", 0.0)
    assert step.started == [("noisy-m", (0,))]  # one slot: one batch
    for i in range(3):
        q["quiet-m"].add(Pending(seq=100 + i, arrival=0.1))
    assert d.kick("quiet-m", 0.1).started == []  # waits for the slot
    order, running, now = [], ("noisy-m", 1), 1.0
    while running:
        step = d.finish(running[0], running[1], now)
        assert len(step.started) <= 1
        running = (step.started[0][0], len(step.started[0][1])) if step.started else None
        if running:
            order.append(running[0])
        now += 1.0
    # the quiet tenant's three requests are not served after the noisy backlog of 19, but interleaved
    assert order.index("quiet-m") <= 1 and order[:6].count("quiet-m") == 3


def test_the_batch_is_formed_when_the_slot_is_granted():
    d, q = _host(mbs=8)
    q["quiet-m"].add(Pending(seq=1, arrival=0.0))
    assert d.kick("quiet-m", 0.0).started == [("quiet-m", (1,))]
    q["noisy-m"].add(Pending(seq=2, arrival=0.1))
    assert d.kick("noisy-m", 0.1).started == []
    q["noisy-m"].add(Pending(seq=3, arrival=0.2))  # arrives while waiting for the slot
    step = d.finish("quiet-m", 1, 1.0)
    assert step.started == [("noisy-m", (2, 3))] and step.waits == [("noisy", 1.0 - 0.1)]


def test_priority_one_goes_first_and_expired_requests_are_reported():
    d, q = _host()
    q["quiet-m"].add(Pending(seq=1, arrival=0.0))
    d.kick("quiet-m", 0.0)  # holds the slot
    q["noisy-m"].add(Pending(seq=2, arrival=0.1, priority=2))
    q["noisy-m"].add(Pending(seq=3, arrival=0.2, priority=1))
    q["noisy-m"].add(Pending(seq=4, arrival=0.2, deadline=0.5))
    d.kick("noisy-m", 0.2)
    step = d.finish("quiet-m", 1, 1.0)
    assert step.expired == [("noisy-m", 4)] and step.started == [("noisy-m", (3,))]


def test_a_model_removed_while_running_frees_its_slot_for_others():
    d, q = _host()
    q["quiet-m"].add(Pending(seq=1, arrival=0.0))
    d.kick("quiet-m", 0.0)
    q["noisy-m"].add(Pending(seq=2, arrival=0.1))
    d.kick("noisy-m", 0.1)
    d.remove("noisy-m")  # its slot request is withdrawn
    d.remove("quiet-m")  # running: it stays until its batch finishes
    step = d.finish("quiet-m", 1, 1.0)
    assert step.started == [] and q["quiet-m"].inflight == 0 and d.slots.free == 1 and d.slots.waiting == 0


def _light_beside_noisy(per_model: int, unit: str) -> int:
    """Noisy (3 executors, a deep backlog) and light models of ONE tenant on 2 slots; the light model's
    request arrives while the noisy model holds what it can. Returns the noisy batches started between the
    light request's arrival and its start."""
    d = Dispatcher(ExecutionSlots(2, per_model=per_model, unit=unit), cost=lambda model, n: 1.0)
    noisy, light = ModelQueue(BatchConfig(max_batch_size=1), 3), ModelQueue(BatchConfig(max_batch_size=1), 1)
    d.add("noisy", noisy, "t")
    d.add("light", light, "t")
    for i in range(40):
        noisy.add(Pending(seq=i, arrival=0.0))
    running = [m for m, _ in d.kick("noisy", 0.0).started]
    light.add(Pending(seq=1000, arrival=0.5))
    started = [m for m, _ in d.kick("light", 0.5).started]
    now, behind = 1.0, 0
    while "light" not in started:
        behind += started.count("noisy")
        running += started
        started = [m for m, _ in d.finish(running.pop(0), 1, now).started]
        now += 1.0
    return behind


def test_light_model_never_waits_behind_more_than_one_noisy_batch():
    assert _light_beside_noisy(per_model=0, unit="model") == 0  # the kept slot: it starts at once
    # every slot to one model: it waits for the first running batch to end, then goes next, by fairness
    assert _light_beside_noisy(per_model=2, unit="model") == 0
    # the old order (every slot to one model, arrival order within the tenant) starts the backlog's waiting
    # batch first: the light request waits for a running batch AND a whole new one; the measure sees it
    assert _light_beside_noisy(per_model=2, unit="tenant") == 1


def _wide_host(wide: bool = True, cost: float = 0.001) -> tuple[Dispatcher, dict[str, ModelQueue]]:
    d = Dispatcher(ExecutionSlots(2), cost=lambda model, n: cost, wide_max_s=0.005)
    queues = {}
    for model, tenant in (("big", "a"), ("light", "b")):
        queues[model] = ModelQueue(BatchConfig(max_batch_size=8), 2)
        d.add(model, queues[model], tenant, wide=wide)
    return d, queues


def test_a_lone_batch_of_one_request_runs_wide_and_holds_every_slot_until_it_ends():
    d, q = _wide_host()
    q["big"].add(Pending(seq=1, arrival=0.0))
    step = d.kick("big", 0.0)
    assert step.started == [("big", (1,))] and step.wide == {"big": (1,)}
    assert d.slots.free == 0  # the idle slot is borrowed: no other batch shares the cores
    q["light"].add(Pending(seq=2, arrival=0.001))
    assert d.kick("light", 0.001).started == []  # waits for that one short batch
    step = d.finish("big", 1, 0.002)
    assert step.started == [("light", (2,))] and step.wide == {"light": (2,)}  # alone again: wide too
    d.finish("light", 1, 0.003)
    assert d.slots.free == 2 and d.slots.held("big") == 0 and d.slots.held("light") == 0


def test_no_wide_batch_beside_another_batch_nor_for_two_requests_nor_past_the_cost_bound():
    d, q = _wide_host()
    q["big"].add(Pending(seq=1, arrival=0.0))
    q["big"].add(Pending(seq=2, arrival=0.0))
    step = d.kick("big", 0.0)
    assert step.started == [("big", (1, 2))] and step.wide == {}  # a batch of two requests: on its slot
    q["light"].add(Pending(seq=3, arrival=0.0))
    step = d.kick("light", 0.0)
    assert step.started == [("light", (3,))] and step.wide == {}  # another batch runs: its own slot only
    for wide, cost in ((False, 0.001), (True, 0.01)):  # a model that cannot, or a batch too long to hold all
        d, q = _wide_host(wide, cost)
        q["big"].add(Pending(seq=1, arrival=0.0))
        step = d.kick("big", 0.0)
        assert step.started == [("big", (1,))] and step.wide == {} and d.slots.free == 1


def test_no_wide_batch_while_requests_wait_behind_it():
    d, q = _wide_host()
    q["big"] = ModelQueue(BatchConfig(max_batch_size=1), 2)  # one request per batch: the rest wait
    d.add("big", q["big"], "a", wide=True)
    q["big"].add(Pending(seq=1, arrival=0.0))
    q["big"].add(Pending(seq=2, arrival=0.0))
    step = d.kick("big", 0.0)
    assert step.started == [("big", (1,))] and step.wide == {}
