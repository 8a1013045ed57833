"""sim driving the router's real placement policy (router.placement_policy.place) through the engine's hook."""

import numpy as np

from router.placement_policy import PlacementConfig, affinity
from sim.cluster import Cluster, ClusterConfig, run_cluster
from sim.costs import ComputeCost, CostModel
from sim.placement import RouterPlacement, host_address
from sim.workload import ModelSpec, Workload

COSTS = CostModel(load_fixed_s=0.5, load_s_per_byte={"storage": 0.0, "disk": 0.0, "host_ram": 0.0},
                  compute_default=ComputeCost(0.001, 0.0))


def _wl(n_models: int, rounds: int, gap: float = 0.01) -> Workload:
    specs = [ModelSpec(f"t/m{i}/1", "t", 100) for i in range(n_models)]
    seq = [i for _ in range(rounds) for i in range(n_models)]
    return Workload(specs, np.arange(len(seq)) * gap, np.array(seq, dtype=np.int64))


def test_two_hosts_room_for_all_each_model_loads_once_on_its_affinity_host():
    # 20 models requested 5 times each, a burst per model arrives while its first load is still running:
    # one load per model in the whole cluster, on the host the rendezvous hash names, and spread over both
    wl = _wl(20, 5)
    hook = RouterPlacement(PlacementConfig(hot_queue_depth=0), seed=1)
    chosen: dict[int, set[int]] = {}

    def record(m, now, cluster):
        h = hook(m, now, cluster)
        chosen.setdefault(m, set()).add(h)
        return h

    r = run_cluster(wl, ClusterConfig(hosts=2, device_bytes=10_000), COSTS, placement=record)
    t = r.total
    assert t.loads == 20 and t.shed == 0 and t.requests == 100
    assert all(len(hs) == 1 for hs in chosen.values()), chosen
    for m, (h,) in chosen.items():
        key = wl.models[m].key
        assert h == max((0, 1), key=lambda i: affinity(key, host_address(i)))
    per_host = [sum(1 for hs in chosen.values() if hs == {i}) for i in (0, 1)]
    assert min(per_host) >= 4, per_host
    assert hook.decisions["load"] == 20 and hook.decisions["loading"] + hook.decisions["ready"] == 80
    assert t.hits == hook.decisions["ready"]


def test_hot_model_gets_a_second_copy_through_the_engine():
    # one model, a burst of 40 requests at once while it loads: the queue passes hot_queue_depth on its one
    # copy once READY, so the policy names the other host and the engine loads a copy there
    specs = [ModelSpec("t/hot/1", "t", 100)]
    times = [0.0] * 20 + [0.6 + i * 1e-4 for i in range(20)]
    wl = Workload(specs, np.array(times), np.zeros(len(times), dtype=np.int64))
    slow = CostModel(load_fixed_s=0.5, load_s_per_byte={"storage": 0.0, "disk": 0.0, "host_ram": 0.0},
                     compute_default=ComputeCost(0.05, 0.0))
    hook = RouterPlacement(PlacementConfig(hot_queue_depth=4), seed=0)
    r = run_cluster(wl, ClusterConfig(hosts=2, device_bytes=1000, batch=_no_batching()), slow, placement=hook)
    assert hook.replications == 1
    assert r.total.loads == 2 and r.total.shed == 0 and len(r.total.latencies) == 40


def test_full_hosts_evict_and_reload_on_the_host_the_router_started_the_load_on():
    # room for 2 of 6 models per host, requests 1 s apart (each load done before the next arrival): models
    # are evicted and loaded again, every request is served; within pending_ttl_s the router's own record of
    # the load it started sends a model back to the same host ("loading"), so only the first loads are "load"
    wl = _wl(6, 4, gap=1.0)
    hook = RouterPlacement(PlacementConfig(hot_queue_depth=0, pending_ttl_s=30.0), seed=0)
    chosen: dict[int, set[int]] = {}

    def record(m, now, cluster):
        chosen.setdefault(m, set()).add(h := hook(m, now, cluster))
        return h

    r = run_cluster(wl, ClusterConfig(hosts=2, device_bytes=200), COSTS, placement=record)
    assert r.total.shed == 0 and len(r.total.latencies) == 24
    assert r.total.loads > 6 and r.total.loads + r.total.hits == 24
    assert hook.decisions["load"] == 6
    assert all(len(hs) == 1 for hs in chosen.values()), chosen


def test_a_retry_sees_only_the_hosts_not_yet_tried():
    # the router's dispatcher places a retry again without the hosts it tried; with none left, no host
    wl = _wl(1, 1)
    cluster = Cluster(wl, ClusterConfig(hosts=3, device_bytes=1000), COSTS)
    hook = RouterPlacement(PlacementConfig(hot_queue_depth=0), seed=0)
    key = wl.models[0].key
    first = hook(0, 0.0, cluster)
    assert first == max(range(3), key=lambda i: affinity(key, host_address(i)))
    rest = [i for i in range(3) if i != first]
    assert hook(0, 0.0, cluster, exclude={first}) == max(rest, key=lambda i: affinity(key, host_address(i)))
    assert hook(0, 0.0, cluster, exclude={0, 1, 2}) is None


def _no_batching():
    from hostd.batch_policy import BatchConfig

    return BatchConfig(max_batch_size=1, max_queue_delay=0.0)
