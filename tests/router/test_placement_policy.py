"""The pure placement policy: no I/O, no clock; the view, this router's own sends and draws go in."""

from __future__ import annotations

from collections import Counter

from router.placement_policy import HostView, ModelLoad, PlacementConfig, Reason, Residency, affinity, place

R, L = Residency.READY, Residency.LOADING
BIG = 1 << 40


def host(addr: str, free: int = BIG, lru: float = float("inf"), count: int = 0, **models: ModelLoad) -> HostView:
    return HostView(addr, free, {k.replace("__", "/"): v for k, v in models.items()}, count, lru)


def test_ready_host_wins_over_loading_and_empty_hosts():
    hosts = [host("a"), host("b", t__m=ModelLoad(L)), host("c", t__m=ModelLoad(R))]
    p = place("t/m", hosts, 0.0)
    assert (p.host, p.reason) == ("c", Reason.READY)


def test_two_choices_pick_the_less_loaded_ready_host_counting_this_routers_own_requests():
    hosts = [host("a", t__m=ModelLoad(R, queue_depth=5)), host("b", t__m=ModelLoad(R, queue_depth=1))]
    assert place("t/m", hosts, 0.0, draws=(0.0, 0.0)).host == "b"
    # the view says b is idle, but this router just sent it 9 requests
    assert place("t/m", hosts, 0.0, local_inflight={"b": 9}, draws=(0.0, 0.0)).host == "a"


def test_two_choices_spread_equal_hosts():
    hosts = [host(x, t__m=ModelLoad(R)) for x in "abcd"]
    picks = Counter(place("t/m", hosts, 0.0, draws=(i / 40, (i * 7 % 40) / 40)).host for i in range(40))
    assert len(picks) >= 3


def test_loading_host_is_waited_on_instead_of_starting_a_second_load():
    hosts = [host("a"), host("b", t__m=ModelLoad(L)), host("c")]
    assert place("t/m", hosts, 0.0) == place("t/m", list(reversed(hosts)), 0.0)
    assert place("t/m", hosts, 0.0).host == "b" and place("t/m", hosts, 0.0).reason is Reason.LOADING


def test_a_load_this_router_started_counts_as_loading_until_it_expires():
    hosts = [host(x) for x in "abc"]
    first = place("t/m", hosts, 100.0)
    assert first.reason is Reason.LOAD
    other = next(h.address for h in hosts if h.address != first.host)
    burst = place("t/m", hosts, 101.0, pending={other: 100.0})
    assert (burst.host, burst.reason) == (other, Reason.LOADING)
    cfg = PlacementConfig(pending_ttl_s=30)
    assert place("t/m", hosts, 131.0, pending={other: 100.0}, cfg=cfg).reason is Reason.LOAD


def test_load_target_is_the_same_for_any_host_order_and_spreads_models():
    hosts = [host(x) for x in ("10.0.0.1:8101", "10.0.0.2:8101", "10.0.0.3:8101")]
    chosen = {}
    for i in range(60):
        key = f"t/model{i}"
        a = place(key, hosts, 0.0, draws=(0.9, 0.1)).host
        b = place(key, list(reversed(hosts)), 5.0, draws=(0.2, 0.7)).host  # another router, other draws
        assert a == b
        chosen[key] = a
    assert min(Counter(chosen.values()).values()) >= 10  # rendezvous hashing spreads evenly


def test_hosts_with_room_come_first_then_oldest_lru_then_fewest_models():
    size = 1000
    full_old = host("full_old", free=10, lru=5.0, count=9)
    roomy = host("roomy", free=5000, lru=500.0, count=30)
    assert place("t/m", [full_old, roomy], 0.0, size_bytes=size).host == "roomy"
    newer = host("newer", free=10, lru=50.0, count=1)
    assert place("t/m", [newer, full_old], 0.0, size_bytes=size).host == "full_old"
    few = host("few", free=10, lru=5.0, count=2)
    assert place("t/m", [full_old, few], 0.0, size_bytes=size).host == "few"


def test_hot_model_gets_a_copy_on_another_host_once():
    cfg = PlacementConfig(hot_queue_depth=4)
    hosts = [host("a", t__m=ModelLoad(R, queue_depth=6)), host("b"), host("c")]
    p = place("t/m", hosts, 0.0, cfg=cfg)
    assert p.host == "a" and p.reason is Reason.READY
    assert p.replicate_to in ("b", "c")
    assert p.replicate_to == place("t/m", list(reversed(hosts)), 0.0, cfg=cfg).replicate_to
    # a copy is already loading (this router started it): no second copy, requests stay on the READY host
    again = place("t/m", hosts, 1.0, pending={p.replicate_to: 0.5}, cfg=cfg)
    assert (again.host, again.replicate_to) == ("a", None)
    # not hot: no copy
    calm = [host("a", t__m=ModelLoad(R, queue_depth=1)), host("b")]
    assert place("t/m", calm, 0.0, cfg=cfg).replicate_to is None


def test_request_rate_per_copy_makes_a_model_hot():
    cfg = PlacementConfig(hot_queue_depth=0, hot_rps_per_copy=100)
    hosts = [host("a", t__m=ModelLoad(R)), host("b")]
    assert place("t/m", hosts, 0.0, rate=50, cfg=cfg).replicate_to is None
    assert place("t/m", hosts, 0.0, rate=150, cfg=cfg).replicate_to == "b"


def test_no_eligible_host():
    assert place("t/m", [], 0.0).reason is Reason.NO_HOST


def test_affinity_is_stable():
    assert affinity("t/m", "h:1") == affinity("t/m", "h:1") != affinity("t/m", "h:2")
