"""router/lane_policy.py: which Python-lane router process serves each tenant. Pure: rates in, lanes out."""

from __future__ import annotations

from router.lane_policy import assign_lanes, greedy, lane_loads


def test_one_lane_keeps_everyone_on_the_router():
    assert assign_lanes({"a": 900.0, "b": 5.0}, 1, {}) == {"a": 0, "b": 0}


def test_the_busiest_tenant_gets_a_lane_of_its_own():
    got = assign_lanes({"noisy": 1800.0, "light": 450.0, "tiny": 20.0}, 2, {})
    assert got["noisy"] != got["light"] and got["light"] == got["tiny"]


def test_tenants_on_one_lane_are_spread_when_that_lowers_the_busiest_lane_enough():
    # both on the router (a worker was down, or they came in one refresh): 2250/s against 1800/s apart
    got = assign_lanes({"noisy": 1800.0, "light": 450.0}, 2, {"noisy": 0, "light": 0})
    assert got["noisy"] != got["light"]


def test_an_assignment_is_kept_while_spreading_would_gain_little():
    rates = {"a": 1000.0, "b": 950.0, "c": 100.0}
    current = {"a": 0, "b": 1, "c": 1}  # loads 1000 / 1050: the best split is 1050 / 1000, no better
    assert assign_lanes(rates, 2, current) == current
    # noise that swaps the two big ones' order moves nobody
    assert assign_lanes({"a": 950.0, "b": 1000.0, "c": 100.0}, 2, current) == current


def test_a_new_tenant_goes_to_the_least_loaded_lane_without_moving_anyone():
    current = {"a": 0, "b": 1}
    got = assign_lanes({"a": 900.0, "b": 300.0, "new": 100.0}, 3, current)
    assert got == {"a": 0, "b": 1, "new": 2}


def test_idle_tenants_neither_move_nor_count_and_unseen_ones_are_dropped():
    got = assign_lanes({"a": 500.0, "idle": 0.2}, 2, {"idle": 1, "gone": 1})
    assert got["idle"] == 1 and "gone" not in got
    assert got["a"] == 0  # a new tenant avoids the lane of one idle for a moment


def test_a_noisy_tenant_that_comes_while_the_light_one_is_idle_still_gets_a_lane_of_its_own():
    got = assign_lanes({"light": 0.0, "noisy": 1500.0}, 2, {"light": 1})
    assert got == {"light": 1, "noisy": 0}
    # and when the light one calls again, nobody moves
    assert assign_lanes({"light": 450.0, "noisy": 1500.0}, 2, got) == got


def test_on_a_tie_a_new_tenant_takes_a_workers_lane_before_the_routers():
    assert assign_lanes({"a": 300.0}, 3, {}) == {"a": 1}


def test_a_lane_past_the_workers_now_running_falls_back_to_the_router():
    got = assign_lanes({"a": 500.0, "b": 400.0}, 2, {"a": 3})
    assert set(got.values()) == {0, 1}


def test_greedy_is_longest_first_and_loads_add_up():
    rates = {"a": 7.0, "b": 5.0, "c": 4.0, "d": 3.0}
    best = greedy(rates, 2)
    assert sorted(lane_loads(rates, best, 2)) == [9.0, 10.0]  # a+d, b+c
    assert best["a"] == 1  # the busiest: a worker's lane before the router's
    assert sum(lane_loads(rates, {"a": 9}, 2)) == sum(rates.values())  # a lane out of range counts on 0
