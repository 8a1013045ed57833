"""Policies driven on small traces whose right answers are worked out by hand."""

import hostd.batch_policy
import hostd.cache.policy
import hostd.core.device
import hostd.core.queue
import sim.cache_only
import sim.cluster
from sim.cache_only import run_cache_only
from sim.offline import next_use, run_offline
from tests.sim.conftest import make_workload

# The textbook reference string (Silberschatz, Operating System Concepts), 3 frames:
# LRU has 12 page faults, OPT (Belady's MIN) 9.
TEXTBOOK = [7, 0, 1, 2, 0, 3, 0, 4, 2, 3, 0, 3, 2, 1, 2, 0, 1, 7, 0, 1]


def test_sim_drives_the_real_policy_code():
    # the simulator drives the host core (tests/hostd/core/test_one_core.py), which calls the real policies
    assert sim.cache_only.DeviceCache is sim.cluster.DeviceCache is hostd.core.device.DeviceCache
    assert hostd.core.device.plan_eviction is hostd.cache.policy.plan_eviction
    assert sim.cluster.ModelQueue is hostd.core.queue.ModelQueue
    assert hostd.core.queue.decide is hostd.batch_policy.decide


def test_lru_vs_belady_on_textbook_sequence(unit_costs):
    seq = [str(p) for p in TEXTBOOK]
    wl = make_workload(seq, {s: 100 for s in seq})
    lru = run_cache_only(wl, 300, "lru", unit_costs).total
    opt = run_offline(wl, 300, unit_costs)
    assert opt.policy == "offline"  # equal sizes: exact MIN, not the heuristic
    assert (lru.loads, lru.hits) == (12, 8)
    assert (opt.total.loads, opt.total.hits) == (9, 11)
    assert opt.total.load_s == 9.0 and lru.load_s == 12.0


def test_size_aware_offline_matches_min_when_sizes_are_equal(unit_costs):
    seq = [str(p) for p in TEXTBOOK]
    wl = make_workload(seq, {s: 100 for s in seq})
    est = run_offline(wl, 300, unit_costs, exact=False)
    assert est.policy == "offline~" and est.total.loads == 9


def test_next_use():
    import numpy as np

    assert next_use(np.array([1, 2, 1, 1, 3])).tolist() == [2, 5, 3, 5, 5]


def test_gdsf_beats_lru_on_mixed_sizes(unit_costs):
    # cache 5 units; s1..s4 one unit, BIG two; every load costs 1 s.
    # LRU: s1 s2 s3 BIG fill 5; s4 evicts s1; s1 evicts s2; s2 evicts s3; s3 evicts BIG; s4 hit;
    #      BIG evicts s1 -> 1 hit, 9 loads.
    # GDSF (priority L + f*cost/size): s* = 1, BIG = 0.5; s4 evicts BIG (L=0.5, s4=1.5); s1 s2 s3 s4 hit
    #      (priority 0.5 + 2 = 2.5 each); BIG evicts s1, the oldest at 2.5 -> 4 hits, 6 loads.
    u = 1 << 20
    seq = ["s1", "s2", "s3", "BIG", "s4", "s1", "s2", "s3", "s4", "BIG"]
    wl = make_workload(seq, {"s1": u, "s2": u, "s3": u, "s4": u, "BIG": 2 * u})
    lru = run_cache_only(wl, 5 * u, "lru", unit_costs).total
    gdsf = run_cache_only(wl, 5 * u, "gdsf", unit_costs).total
    assert (lru.hits, lru.loads, lru.load_s) == (1, 9, 9.0)
    assert (gdsf.hits, gdsf.loads, gdsf.load_s) == (4, 6, 6.0)
    assert gdsf.bytes_missed == 8 * u and lru.bytes_missed == 11 * u
