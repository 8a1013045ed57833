"""hostd's load path on a virtual clock: the pool (sim/loadpool.py) alone, then in the full engine (load
queueing, the loader's lock, eviction waits, a request for a closing model, the router's retry elsewhere)."""

from dataclasses import replace

import pytest

from sim.cluster import Cluster, ClusterConfig, default_placement
from sim.costs import ComputeCost, CostModel
from sim.loadpool import Job, LoadPool, Stage
from tests.sim.conftest import make_workload


def drive(pool: LoadPool, jobs: list[tuple[float, Job]]) -> dict[str, float]:
    """Run jobs submitted at the given times to the end; returns each job's finish time by ref."""
    events: list[tuple[float, int, Job]] = []
    done: dict[str, float] = {}
    seq = 0

    def take(p, now):
        nonlocal seq
        for j in p.started:
            seq += 1
            events.append((now + j.stage_s, seq, j))
        for j in p.finished:
            done[j.ref] = now

    pending = sorted(jobs, key=lambda x: x[0])
    while pending or events:
        events.sort(key=lambda e: (e[0], e[1]))
        if pending and (not events or pending[0][0] <= events[0][0]):
            at, job = pending.pop(0)
            take(pool.submit(job, at), at)
        else:
            at, _, job = events.pop(0)
            take(pool.done(job, at), at)
    return done


def test_workers_take_jobs_in_fifo_order():
    pool = LoadPool(2, lock=False)
    jobs = [(0.0, Job("load", "a", 1.0)), (0.0, Job("load", "b", 1.0)), (0.0, Job("load", "c", 1.0)),
            (0.5, Job("close", "d", 0.1))]
    done = drive(pool, jobs)
    assert done == {"a": 1.0, "b": 1.0, "c": 2.0, "d": 1.1}  # c queued first, d after it, both at 1.0
    assert [j.pool_wait for _, j in jobs] == [0.0, 0.0, 1.0, 0.5]
    assert pool.idle == 2 and pool.queued == 0


def test_the_locked_stage_runs_one_at_a_time_and_lock_waits_are_kept():
    pool = LoadPool(4)
    a, b = Job("load", "a", 0.2, 1.0), Job("load", "b", 0.1, 1.0)
    done = drive(pool, [(0.0, a), (0.0, b)])
    # b's first stage ends first, so b takes the lock first; a waits for it (lock, not workers)
    assert done == {"b": pytest.approx(1.1), "a": pytest.approx(2.1)}
    assert (a.pool_wait, b.pool_wait) == (0.0, 0.0)
    assert a.lock_wait == pytest.approx(0.9) and b.lock_wait == 0.0
    assert a.stage is Stage.DONE and pool.idle == 4
    no_lock = LoadPool(4, lock=False)
    assert drive(no_lock, [(0.0, Job("load", "a", 0.2, 1.0)), (0.0, Job("load", "b", 0.1, 1.0))]) == {
        "a": pytest.approx(1.2), "b": pytest.approx(1.1)}


def test_a_close_queued_behind_loads_waiting_for_the_lock():
    """Workers blocked on the lock still hold their thread: a close behind them waits (the eviction wait)."""
    pool = LoadPool(2)
    done = drive(pool, [(0.0, Job("load", "a", 0.0, 1.0)), (0.0, Job("load", "b", 0.0, 1.0)),
                        (0.1, Job("close", "c", 0.05))])
    assert done["c"] == pytest.approx(1.05)  # a worker frees when a's locked stage ends at 1.0


COSTS = CostModel(load_fixed_s=1.0, load_s_per_byte={"storage": 0.0, "disk": 0.0, "host_ram": 0.0},
                  compute_default=ComputeCost(0.1, 0.0), unload_s=0.5)


def latencies(c: Cluster) -> list[float]:
    return sorted(x for s in c.stats.values() for x in s.latencies)


def test_loads_queue_for_the_lock_on_one_host():
    wl = make_workload(["a", "b"], {"a": 10, "b": 10})  # arrivals at t=0 and t=1
    old = Cluster(wl, ClusterConfig(device_bytes=100), COSTS)
    old.run()
    new = Cluster(wl, ClusterConfig(device_bytes=100, load_workers=4), COSTS)
    new.run()
    # one load at a time either way here (no first stage): a done at 1.0, b at 2.0
    assert latencies(old) == latencies(new) == [pytest.approx(1.1), pytest.approx(1.1)]
    staged = CostModel(load_fixed_s=1.0, load_s_per_byte={"storage": 0.5, "disk": 0.0, "host_ram": 0.0},
                       compute_default=ComputeCost(0.1, 0.0))
    wl2 = make_workload(["a", "b"], {"a": 2, "b": 2})
    wl2.ts[:] = 0.0
    c = Cluster(wl2, ClusterConfig(device_bytes=100, load_workers=4), staged)
    c.run()
    # both fetch at once (1 s each on their own workers), then deserialize one after the other
    assert latencies(c) == [pytest.approx(2.1), pytest.approx(3.1)]
    assert sorted(c.load_waits["lock_wait"]) == [0.0, pytest.approx(1.0)]
    assert c.load_waits["pool_wait"] == [0.0, 0.0]


def test_a_load_that_needs_room_waits_for_its_victims_close():
    wl = make_workload(["a", "b", "c"], {"a": 6, "b": 4, "c": 6})  # c needs a's room
    wl.ts[:] = [0.0, 0.0, 5.0]
    c = Cluster(wl, ClusterConfig(device_bytes=10, load_workers=4), COSTS)
    c.run()
    # a, b: 1.1 and 2.1 (the lock); c at 5: a is closed first (0.5 s), then c loads (1 s), then runs (0.1 s)
    assert latencies(c) == [pytest.approx(1.1), pytest.approx(1.6), pytest.approx(2.1)]
    assert c.load_waits["evict"][-1] == pytest.approx(0.5)
    h = c.hosts[0]
    assert set(h.cache.residents) == {1, 2} and h.cache.used == 10
    before = Cluster(wl, ClusterConfig(device_bytes=10), COSTS)  # old model: the eviction is free
    before.run()
    assert latencies(before)[1] == pytest.approx(1.1)


def test_a_request_for_a_model_being_closed_waits_and_loads_it_again():
    wl = make_workload(["a", "b", "c", "a"], {"a": 6, "b": 6, "c": 6})
    wl.ts[:] = [0.0, 0.0, 3.0, 3.2]
    c = Cluster(wl, ClusterConfig(device_bytes=12, load_workers=4), COSTS)
    t = c.run().total
    # a 0-1, b 1-2 (the lock). c at 3.0 evicts a (LRU): a closes 3.0-3.5, c loads 3.5-4.5, runs to 4.6.
    # a asked again at 3.2 waits for its own close; at 3.5 it needs b's room: b closes 3.5-4.0, then a loads
    # when the lock is free (4.5-5.5) and runs to 5.6: 2.4 s after it was asked for
    assert (t.requests, t.hits, t.loads, t.shed) == (4, 0, 4, 0)
    assert sorted(t.latencies) == [pytest.approx(x) for x in (1.1, 1.6, 2.1, 2.4)]
    assert c.load_waits["evict"] == [0.0, 0.0, pytest.approx(0.5), pytest.approx(0.5)]
    assert c.load_waits["lock_wait"][-1] == pytest.approx(0.5)
    h = c.hosts[0]
    assert set(h.cache.residents) == {0, 2} and h.cache.used == 12 and h.pool.idle == 4


def test_the_router_tries_another_host_when_one_has_no_room():
    wl = make_workload(["a", "b"], {"a": 10, "b": 10})
    wl.ts[:] = [0.0, 0.5]  # a keeps host 0 busy (loading) when b arrives

    def pin_host0(m, now, cluster, exclude=()):  # host 0 first; a retry placed as the default does
        return default_placement(m, now, cluster, exclude) if exclude else 0

    one = Cluster(wl, ClusterConfig(hosts=2, device_bytes=10, load_workers=4), COSTS, placement=pin_host0)
    assert one.run().total.shed == 1 and one.shed_reasons == {"unavailable": 1}
    retry = Cluster(wl, ClusterConfig(hosts=2, device_bytes=10, load_workers=4, attempts=3), COSTS,
                    placement=pin_host0)
    t = retry.run().total
    assert t.shed == 0 and 1 in retry.hosts[1].models


def test_a_retry_goes_where_the_placement_hook_says_with_the_tried_hosts_excluded():
    wl = make_workload(["a", "b"], {"a": 10, "b": 10})
    wl.ts[:] = [0.0, 0.5]  # a keeps host 0 busy (loading) when b arrives: b has no room there
    asked = []

    def hook(m, now, cluster, exclude=()):  # host 0 first, then the last host not excluded (not the default's 1)
        asked.append((m, frozenset(exclude)))
        return max((i for i in range(len(cluster.hosts)) if i not in exclude), default=None) if exclude else 0

    c = Cluster(wl, ClusterConfig(hosts=3, device_bytes=10, load_workers=4, attempts=3), COSTS, placement=hook)
    t = c.run().total
    assert t.shed == 0 and 1 in c.hosts[2].models and 1 not in c.hosts[1].models
    assert asked == [(0, frozenset()), (1, frozenset()), (1, frozenset({0}))]
    # every host tried: placed with all of them excluded, the hook has none left and the request is shed
    full = Cluster(wl, ClusterConfig(hosts=1, device_bytes=10, load_workers=4, attempts=3), COSTS,
                   placement=default_placement)
    assert full.run().total.shed == 1 and full.shed_reasons == {"unavailable": 1}


def test_measured_sizes_that_vary_from_load_to_load_evict_more():
    wl = make_workload(["a", "b"], {"a": 4, "b": 4})
    wl.ts[:] = [0.0, 5.0]  # a is loaded when b comes
    base = ClusterConfig(device_bytes=10, high=0.95, low=0.5, load_workers=4)
    plain = Cluster(wl, base, COSTS)
    plain.run()
    assert set(plain.hosts[0].cache.residents) == {0, 1} and plain.evictions["capacity"] == 0
    from dataclasses import replace

    grown = Cluster(wl, replace(base, size_spread=((1.5, 0.0), (1.5, 1.0))), COSTS)  # every load measures 1.5x
    grown.run()
    h = grown.hosts[0]
    # a reserved 4, measured 6; b's 4 more pass the high watermark (9.5): a goes, down to the low one
    assert set(h.cache.residents) == {1} and h.cache.used == 6 and grown.evictions["capacity"] == 1
    assert h.measured == {0: 6, 1: 6}  # what the next reservation of each will ask for


def test_a_reload_prepacks_under_the_lock_after_it_answered_and_a_first_load_does_not():
    wl = make_workload(["a", "b", "a", "b"], {"a": 6, "b": 6})  # one model fits at a time
    wl.ts[:] = [0.0, 2.0, 4.0, 5.3]
    quick = CostModel(load_fixed_s=1.0, load_s_per_byte={"storage": 0.0, "disk": 0.0, "host_ram": 0.0},
                      compute_default=ComputeCost(0.1, 0.0), unload_s=0.1, prepack_s_per_byte=0.1)
    c = Cluster(wl, ClusterConfig(device_bytes=6, load_workers=4), quick)
    c.run()
    # a 0-1 (first), b 2.1-3.1 (first), a again 4.1-5.1, answered 5.2, then prepacks 5.1-5.7 under the lock.
    # b asked at 5.3 closes a by 5.4 and waits for the lock until 5.7: loads 5.7-6.7, answered at 6.8
    assert c.load_waits["lock_wait"] == [0.0, 0.0, 0.0, pytest.approx(0.3)]
    assert latencies(c) == [pytest.approx(x) for x in (1.1, 1.2, 1.2, 1.5)]
    none = Cluster(wl, ClusterConfig(device_bytes=6, load_workers=4), replace(quick, prepack_s_per_byte=0.0))
    none.run()
    assert none.load_waits["lock_wait"] == [0.0, 0.0, 0.0, 0.0]
    assert latencies(none) == [pytest.approx(x) for x in (1.1, 1.2, 1.2, 1.2)]
