"""sim driving the router's real placement policy (router.placement_policy.place) through the engine's hook."""

import numpy as np
import pytest

from router.placement_policy import PlacementConfig, affinity
from sim.cluster import Cluster, ClusterConfig, run_cluster
from sim.costs import ComputeCost, CostModel
from sim.placement import RouterPlacement, host_address
from sim.workload import ModelSpec, Workload
from tests.sim.noisy_workload import noisy_beside_light

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


def _light_beside_noisy_two_hosts():
    """tests/sim/noisy_workload.py's workload on two hosts of 2 slots each (the noisy model may hold both)."""
    wl, costs = noisy_beside_light()
    cfg = ClusterConfig(hosts=2, device_bytes=1000, slots=2, executors_per_model=2, per_model_slots=2)
    return wl, cfg, costs


def test_host_groups_keep_a_light_model_off_the_noisy_models_host():
    wl, cfg, costs = _light_beside_noisy_two_hosts()
    # without groups the hot noisy model gets a copy on the other host too, so the light model's host runs
    # noisy batches in both its slots and a light request waits for one
    plain = RouterPlacement(PlacementConfig(hot_queue_depth=4), seed=0)
    r = run_cluster(wl, cfg, costs, placement=plain)
    assert plain.replications == 1 and max(r.tenants["light"].latencies[1:]) > 0.001
    # groups: the noisy tenant's group "bulk" is the host the light model's affinity does not pick; the light
    # model stays in the shared pool
    shared = max((0, 1), key=lambda i: affinity(wl.models[1].key, host_address(i)))
    bulk = 1 - shared
    groups = ["", ""]
    groups[bulk] = "bulk"
    chosen: dict[int, set[int]] = {}
    hook = RouterPlacement(PlacementConfig(hot_queue_depth=4), seed=0, groups={"noisy": "bulk"}, host_groups=groups)

    def record(m, now, cluster, exclude=()):
        h = hook(m, now, cluster, exclude)
        chosen.setdefault(m, set()).add(h)
        return h

    r = run_cluster(wl, cfg, costs, placement=record)
    assert chosen == {0: {bulk}, 1: {shared}}
    assert hook.replications == 0  # hot, but its group has no other host: no copy on the light model's host
    assert max(r.tenants["light"].latencies[1:]) == pytest.approx(0.0001)  # never behind a noisy batch
    assert r.total.shed == 0 and len(r.total.latencies) == len(wl)


def test_sim_config_places_by_groups_only_with_a_host_in_each_group():
    from sim.config import SimConfig

    assert SimConfig(mode="full").placement() is None  # no groups: the engine's default placement
    hook = SimConfig(mode="full", hosts=2, host_groups=["", "bulk"], groups={"noisy": "bulk"}).placement()
    assert isinstance(hook, RouterPlacement) and hook.host_groups == ("", "bulk")
    for bad in ({"hosts": 1, "host_groups": ["", "bulk"]},  # more groups than hosts
                {"hosts": 2, "host_groups": ["", ""], "groups": {"noisy": "bulk"}},  # no host of group bulk
                {"hosts": 1, "host_groups": ["bulk"], "groups": {"noisy": "bulk"}}):  # none left for the shared pool
        with pytest.raises(ValueError):
            SimConfig(mode="full", **bad)
