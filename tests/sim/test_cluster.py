"""The full engine: batching through hostd.batch_policy, single-flight loads, sheds, hooks."""

import numpy as np
import pytest

from hostd.batch_policy import BatchConfig
from sim.cache_only import run_cache_only
from sim.cluster import ClusterConfig, run_cluster
from sim.costs import ComputeCost, CostModel
from sim.workload import ModelSpec, SyntheticConfig, Workload, generate
from tests.sim.noisy_workload import noisy_beside_light

COSTS = CostModel(load_fixed_s=1.0, load_s_per_byte={"storage": 0.0, "disk": 0.0, "host_ram": 0.0},
                  compute_default=ComputeCost(0.010, 0.001))


def _wl(times, models, sizes=(100, 100)):
    specs = [ModelSpec(f"t/m{i}/1", "t", s) for i, s in enumerate(sizes)]
    return Workload(specs, np.array(times, dtype=float), np.array(models, dtype=np.int64))


def test_single_flight_load_then_one_batch():
    # five requests at t=0 for one model: one load (1 s), then one batch of 5 (0.010 + 5 * 0.001 s)
    r = run_cluster(_wl([0.0] * 5, [0] * 5), ClusterConfig(device_bytes=1000), COSTS)
    t = r.total
    assert (t.loads, t.hits, t.shed) == (1, 0, 0)
    assert t.latencies == pytest.approx([1.015] * 5)


def test_batches_grow_while_the_executor_is_busy():
    # model already loaded by the first request; the next 6 arrive while its batch runs
    times = [0.0] + [1.001 + i * 0.0001 for i in range(6)]
    r = run_cluster(_wl(times, [0] * 7), ClusterConfig(device_bytes=1000, batch=BatchConfig(max_batch_size=4)),
                    COSTS)
    lat = r.total.latencies
    # batch 1: request 0 alone at t=1.0 (load done) -> done at 1.011; it is busy when the others arrive,
    # then batches of 4 and 2 run back to back: done at 1.025 and 1.037
    assert lat[0] == pytest.approx(1.011)
    done = sorted(round(times[i + 1] + x, 6) for i, x in enumerate(lat[1:]))
    assert done == pytest.approx([1.025] * 4 + [1.037] * 2)
    assert r.total.hits == 6


def test_unavailable_when_everything_is_busy():
    # the cache holds one model; a second model is requested while the first is still loading
    r = run_cluster(_wl([0.0, 0.5], [0, 1]), ClusterConfig(device_bytes=150), COSTS)
    assert r.shed_reasons == {"unavailable": 1}
    assert r.total.loads == 1 and len(r.total.latencies) == 1


def test_deadline_expires_before_execution():
    r = run_cluster(_wl([0.0, 0.0], [0, 0]), ClusterConfig(device_bytes=1000, deadline_s=0.5), COSTS)
    assert r.shed_reasons == {"deadline": 2} and r.total.latencies == []


def test_queue_full_and_hooks():
    calls = []

    def admission(key, tenant, now, cluster):
        calls.append((key, now))
        return "quota" if now >= 2.0 else None

    def placement(model, now, cluster):
        return 1

    cfg = ClusterConfig(hosts=2, device_bytes=1000, max_queue=2)
    r = run_cluster(_wl([0.0, 0.0, 0.0, 2.0], [0, 0, 0, 1]), cfg, COSTS, admission=admission, placement=placement)
    assert r.shed_reasons == {"queue_full": 1, "quota": 1}
    assert len(calls) == 4 and calls[-1] == ("t/m1/1", 2.0)


def test_low_load_matches_cache_only_fast_path():
    wl = generate(SyntheticConfig(models=100, requests=3000, rate=0.1, tenants=2, seed=5))
    b = wl.total_bytes // 8
    full = run_cluster(wl, ClusterConfig(device_bytes=b, policy="lru"))
    fast = run_cache_only(wl, b, "lru")
    # same loads; the few requests that arrive while their model is loading are misses in the full engine
    assert full.total.loads == fast.total.loads
    assert 0 <= fast.total.hits - full.total.hits <= 5
    assert full.row()["p99_ms"] > full.row()["p50_ms"] > 0


def test_host_execution_slots_share_the_device_by_tenant_weight():
    # one host slot, two tenants flooding 300 requests each at t=2 (both models loaded by then), 10 ms per
    # batch of one, two executors per model (so each always has a batch waiting for the slot): the slots'
    # fair share (hostd.sched_policy) splits the device by weight
    specs = [ModelSpec("gold/m/1", "gold", 10), ModelSpec("plain/m/1", "plain", 10)]
    times = [0.0, 0.0] + [2.0] * 600
    models = [0, 1] + [0, 1] * 300
    wl = Workload(specs, np.array(times), np.array(models, dtype=np.int64))
    costs = CostModel(load_fixed_s=0.5, load_s_per_byte={"storage": 0.0, "disk": 0.0, "host_ram": 0.0},
                      compute_default=ComputeCost(0.010, 0.0))

    def last_done(weights):
        cfg = ClusterConfig(device_bytes=1000, slots=1, weights=weights, executors_per_model=2,
                            batch=BatchConfig(max_batch_size=1))
        r = run_cluster(wl, cfg, costs)
        return {t: max(s.latencies[1:]) for t, s in r.tenants.items()}

    even = last_done(None)
    assert even["gold"] == pytest.approx(6.0, abs=0.02) and even["plain"] == pytest.approx(6.0, abs=0.02)
    weighted = last_done({"gold": 3.0})
    # gold gets 3 batches for each of plain's: its 300 are done after 400 batches; plain finishes last
    assert weighted["gold"] == pytest.approx(4.0, abs=0.03) and weighted["plain"] == pytest.approx(6.0, abs=0.02)


def _noisy_beside_light(**cfg):
    """tests/sim/noisy_workload.py's workload on one host with 2 slots (the noisy model with 2 executors)."""
    wl, costs = noisy_beside_light()
    r = run_cluster(wl, ClusterConfig(device_bytes=1000, slots=2, executors_per_model=2, **cfg), costs)
    noisy_done = max(2.0 + x for x in r.tenants["noisy"].latencies[1:])
    return max(r.tenants["light"].latencies[1:]), noisy_done


def test_a_light_model_beside_a_saturating_one_on_the_host_core():
    kept, _ = _noisy_beside_light()  # hostd's default: one slot kept for other models
    assert kept == pytest.approx(0.0001)  # the light model never waits for a noisy batch
    every, noisy_done = _noisy_beside_light(per_model_slots=2)  # the noisy model may take both slots
    assert 0.0001 < every <= 0.010 + 0.0001  # it waits for a running batch, at most one
    _, capped_done = _noisy_beside_light()
    assert capped_done > noisy_done  # what the kept slot costs a model with 2 executors: half the slots


def test_cpu_contention_slots_times_threads_over_the_cores():
    sized, _ = _noisy_beside_light(cores=2, threads=1)  # 2 slots x 1 thread on 2 cores: no slowdown
    over, _ = _noisy_beside_light(cores=2, threads=2)  # 2 slots x 2 threads: batches beside others run 2x slower
    assert sized == pytest.approx(0.0001) and over == pytest.approx(0.0002)
