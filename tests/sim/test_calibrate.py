"""`mmhost sim calibrate`'s fitting (sim/calibrate.py) on hand-made scrapes: load stages, overhead outside
hostd, and the cluster's settings from its gauges, into a config `sim run` accepts."""

import numpy as np
import pytest

from sim.calibrate import RouterScrape, calibrate_cluster, load_samples, parse_router_metrics
from sim.config import SimConfig
from sim.costs import calibrate, spread_points
from sim.fidelity import HostdScrape

MB = 1_000_000
FIXED, PER_BYTE, FETCH = 0.02, 10e-9, 4e-9  # 20 ms + 10 ms/MB under the lock; 4 ms/MB to fetch from storage


def scrape(loads: dict[str, float], ram: float, sizes: dict[str, int], requests: float, request_s: float,
           **gauges: float) -> HostdScrape:
    """A cumulative hostd page after `loads` (per tenant/model), `ram` of them from host RAM."""
    nbytes = sum(n * sizes[k] for k, n in loads.items())
    count = sum(loads.values())
    not_ram_bytes = nbytes * (count - ram) / count if count else 0.0
    s = HostdScrape(loads=dict(loads), tiers={"host_ram": ram, "storage": count - ram},
                    phases={"fetch": FETCH * not_ram_bytes * 0.75, "verify": FETCH * not_ram_bytes * 0.25},
                    path={"locked": FIXED * count + PER_BYTE * nbytes}, requests=requests, request_s=request_s,
                    memory={f"{k}/1": v for k, v in sizes.items()},
                    compute={"t/a": [0.5, 100.0]}, rows={"t/a": [200.0, 100.0]})
    for k, v in gauges.items():
        setattr(s, k, v)
    return s


SIZES = {"t/a": 2 * MB, "t/b": 5 * MB, "t/c": 1 * MB}
GAUGES = {"budget": 10 * MB, "high": 9.5 * MB, "low": 8.5 * MB, "ram_budget": 1 << 30, "slots": 2,
          "load_workers": 4}


def series() -> list[HostdScrape]:
    return [scrape({}, 0, SIZES, 0, 0.0, **GAUGES),
            scrape({"t/a": 3, "t/b": 1}, 1, SIZES, 100, 2.0, **GAUGES),
            scrape({"t/a": 4, "t/b": 3, "t/c": 2}, 3, SIZES, 300, 5.0, **GAUGES)]


def test_load_samples_per_interval_or_from_one_scrape():
    s = series()
    size_of = {k: float(v) for k, v in SIZES.items()} | {"": 1.0}
    got = load_samples(s, size_of)
    assert [(x["count"], x["bytes"], x["ram"]) for x in got] == [(4, 11 * MB, 1), (5, 14 * MB, 2)]
    one = load_samples(s[-1:], size_of)
    assert [(x["count"], x["bytes"]) for x in one] == [(9, 25 * MB)]


def test_calibrated_config_recovers_the_stages_and_the_settings():
    s = series()
    router = [RouterScrape(0.0, 0.0), RouterScrape(9.0, 300.0)]  # 30 ms per request at the router
    cfg = calibrate_cluster([s, s], [router])
    assert cfg["hosts"] == 2 and cfg["cache_bytes"] == 10 * MB and (cfg["high"], cfg["low"]) == (0.95, 0.85)
    assert (cfg["slots"], cfg["load_workers"], cfg["attempts"], cfg["host_ram_bytes"]) == (2, 4, 3, 1 << 30)
    c = cfg["costs"]
    assert c["load_fixed_s"] == pytest.approx(FIXED) and c["locked_s_per_byte"] == pytest.approx(PER_BYTE)
    # the bytes of the loads not from RAM are estimated per interval in proportion to their count
    assert c["load_s_per_byte"]["storage"] == pytest.approx(FETCH, rel=0.01) and c["load_s_per_byte"]["host_ram"] == 0
    assert c["request_overhead_s"] == pytest.approx(0.030 - 5.0 / 300)
    sim = SimConfig.model_validate(cfg)
    cm = sim.cost_model()
    assert cm.locked_seconds(3 * MB) == pytest.approx(FIXED + 3 * MB * PER_BYTE)
    assert cm.first_seconds(3 * MB, "storage") == pytest.approx(3 * MB * FETCH, rel=0.01)
    assert cm.batch_seconds("t/a/1", 2) == pytest.approx(0.005)  # 5 ms per batch of 2 rows, through the origin
    cl = sim.cluster("lru", sim.cache_bytes)
    assert (cl.hosts, cl.slots, cl.load_workers, cl.attempts) == (2, 2, 4, 3)


def test_no_hostd_no_config_and_a_router_page_is_told_apart():
    with pytest.raises(ValueError, match="no hostd"):
        calibrate_cluster([], [])
    text = ("# TYPE mmhost_router_forward_seconds histogram\n"
            'mmhost_router_forward_seconds_bucket{le="+Inf"} 4.0\n'
            "mmhost_router_forward_seconds_count 4.0\nmmhost_router_forward_seconds_sum 0.2\n")
    assert parse_router_metrics(text) == RouterScrape(0.2, 4.0, {float("inf"): 4.0})


def test_overhead_outside_hostd_is_a_difference_of_medians_when_buckets_exist():
    from sim.calibrate import overhead_s, quantile_from_buckets

    inf = float("inf")
    assert quantile_from_buckets({0.01: 0.0, 0.02: 10.0, inf: 10.0}, 0.5) == pytest.approx(0.015)
    assert quantile_from_buckets({0.01: 5.0, inf: 10.0}, 0.9) == 0.01  # in the +Inf bucket: the last bound
    # the router: 100 requests, half under 20 ms (its median 20 ms); hostd: median 5 ms. A few very slow
    # requests pull the router's mean to 110 ms, but the overhead of a typical request stays 15 ms
    router = [RouterScrape(), RouterScrape(11.0, 100.0, {0.01: 0.0, 0.02: 50.0, 1.0: 90.0, inf: 100.0})]
    host = [HostdScrape(), HostdScrape(requests=100.0, request_s=1.0, buckets={0.0: 0.0, 0.01: 100.0, inf: 100.0})]
    assert overhead_s([host], [router]) == pytest.approx(0.015)
    no_buckets = [RouterScrape(), RouterScrape(11.0, 100.0)]
    assert overhead_s([[HostdScrape(), HostdScrape(requests=100.0, request_s=1.0)]], [no_buckets]) == pytest.approx(0.1)


def test_staged_samples_fit_the_two_stages_apart():
    loads = [{"tier": "storage", "count": 2, "bytes": 6 * MB, "seconds": 0.0,
              "first_seconds": 6 * MB * FETCH, "locked_seconds": 2 * FIXED + 6 * MB * PER_BYTE},
             {"tier": "storage", "count": 3, "bytes": 4 * MB, "seconds": 0.0,
              "first_seconds": 4 * MB * FETCH, "locked_seconds": 3 * FIXED + 4 * MB * PER_BYTE}]
    cm = calibrate({"loads": loads})
    assert cm.load_fixed_s == pytest.approx(FIXED) and cm.locked_s_per_byte == pytest.approx(PER_BYTE)
    assert cm.load_s_per_byte["storage"] == pytest.approx(FETCH) and cm.first_fixed_s == pytest.approx(0, abs=1e-12)
    assert cm.load_seconds(MB, "storage") == pytest.approx(FIXED + MB * (PER_BYTE + FETCH))


def test_the_locked_stage_spread_from_histogram_buckets_has_mean_one():
    import numpy as np

    from sim.calibrate import spread_from_buckets
    from sim.costs import CostModel

    buckets = {0.01: 0.0, 0.05: 50.0, 0.1: 90.0, 0.25: 90.0, 0.5: 100.0, float("inf"): 100.0}
    pts = spread_from_buckets(buckets)
    mean = 0.5 * 0.03 + 0.4 * 0.075 + 0.1 * 0.375  # uniform within each bucket with observations
    assert pts == [[pytest.approx(x / mean), p] for x, p in [(0.01, 0.0), (0.05, 0.5), (0.1, 0.9), (0.25, 0.9),
                                                              (0.5, 1.0)]]
    cm = CostModel(locked_spread=tuple(map(tuple, pts)))
    draws = [cm.locked_multiplier(u) for u in np.linspace(0, 1, 100_001)]
    assert np.mean(draws) == pytest.approx(1.0, rel=1e-3)
    assert cm.locked_multiplier(0.5) == pytest.approx(0.05 / mean) and CostModel().locked_multiplier(0.7) == 1.0
    assert spread_from_buckets({0.1: 0.0, float("inf"): 0.0}) == []


def test_streaks_of_slow_loads_from_the_per_interval_means():
    from sim.calibrate import spread_variance, streak_correlation

    d, mu = 0.5, 0.04  # each load's locked stage: mu x (1 - d) or mu x (1 + d), equally likely
    assert spread_variance([[1 - d, 0.0], [1 - d, 0.5], [1 + d, 0.5], [1 + d, 1.0]]) == pytest.approx(d * d)

    def series(per_interval: list[list[float]]) -> list[HostdScrape]:
        out, n, total = [HostdScrape()], 0.0, 0.0
        for loads in per_interval:
            n, total = n + len(loads), total + sum(loads)
            out.append(HostdScrape(path={"locked": total, "locked_count": n}))
        return out

    together = [[mu * (1 + d)] * 4, [mu * (1 - d)] * 4] * 5  # every interval's loads slow or fast together
    assert streak_correlation([series(together)], d * d) == pytest.approx(1.0)
    mixed = [[mu * (1 + d), mu * (1 - d)] * 2] * 10  # each interval's mean is the overall mean
    assert streak_correlation([series(mixed)], d * d) == 0.0
    assert streak_correlation([series([[mu]] * 10)], d * d) == 0.0  # one load per interval: nothing to tell


def test_a_window_shares_its_draw_when_streaks_are_calibrated():
    from dataclasses import replace

    from sim.cluster import Cluster, ClusterConfig
    from sim.costs import CostModel
    from tests.sim.conftest import make_workload

    wl = make_workload(["a", "b", "c"], {"a": 1, "b": 1, "c": 1})
    wl.ts[:] = [0.0, 0.1, 20.0]
    cm = CostModel(load_fixed_s=1.0, load_s_per_byte={"storage": 0.0, "disk": 0.0, "host_ram": 0.0},
                   locked_spread=((0.5, 0.0), (1.5, 1.0)), locked_window_s=10.0)
    cfg = ClusterConfig(device_bytes=10, load_workers=4, seed=3)
    own = Cluster(wl, cfg, cm)
    own.run()
    a, b, c = own.load_waits["locked"]
    assert len({a, b, c}) == 3 and all(0.5 <= x <= 1.5 for x in (a, b, c))
    shared = Cluster(wl, cfg, replace(cm, locked_corr=1.0))
    shared.run()
    a, b, c = shared.load_waits["locked"]
    assert a == b != c  # a and b in the window [0, 10), c in [20, 30)


def test_the_time_outside_hostd_spread_from_an_access_log_is_each_requests_own():
    """Per served request: total at the router minus hostd's load wait, queue and compute; refused and
    malformed records are left out; the spread is an inverse CDF in seconds, non-decreasing."""
    from sim.calibrate import OVERHEAD_QUANTILES, overhead_spread_from_log

    recs = [{"status": "OK", "total_ms": 3.0 + i, "load_ms": 0.5, "queue_ms": 0.25, "compute_ms": 0.25}
            for i in range(99)]  # overheads 2 .. 100 ms
    recs += [{"status": "RESOURCE_EXHAUSTED", "total_ms": 500.0}, {"status": "OK"}]
    spread = overhead_spread_from_log(recs)
    assert len(spread) == len(OVERHEAD_QUANTILES)
    assert spread[0] == [pytest.approx(0.002), 0.0] and spread[-1] == [pytest.approx(0.100), 1.0]
    assert np.interp(0.5, *spread_points(spread)) == pytest.approx(0.051)  # the median request's 51 ms
    assert all(a[0] <= b[0] for a, b in zip(spread, spread[1:], strict=False))
    assert overhead_spread_from_log([{"status": "UNAVAILABLE", "total_ms": 1.0}]) == []


def test_the_spread_s_tail_is_the_requests_own_not_a_line_to_the_slowest_one():
    """200 requests with 10 ms outside hostd and one with 500 ms: the spread's p99 is the requests' own p99
    (10 ms); with points every 2.5% only it drew a line from p97.5 to the 500 ms one (304 ms at p99)."""
    from sim.calibrate import overhead_spread_from_log

    recs = [{"status": "OK", "total_ms": 10.0}] * 200 + [{"status": "OK", "total_ms": 500.0}]
    spread = spread_points(overhead_spread_from_log(recs))
    assert np.interp(0.99, *spread) == pytest.approx(0.010)
    assert np.interp(0.995, *spread) < 0.5 and np.interp(1.0, *spread) == pytest.approx(0.5)


def test_the_time_outside_hostd_spread_from_histograms_is_the_difference_of_quantiles():
    from sim.calibrate import overhead_spread

    inf = float("inf")
    # router: uniform 10-20 ms; hostd: everything under 5 ms (uniform 0-5): the difference runs ~10 -> ~15 ms
    router = [RouterScrape(), RouterScrape(1.5, 100.0, {0.01: 0.0, 0.02: 100.0, inf: 100.0})]
    host = [HostdScrape(), HostdScrape(requests=100.0, request_s=0.25, buckets={0.0: 0.0, 0.005: 100.0, inf: 100.0})]
    spread = overhead_spread([host], [router])
    xs = [x for x, _ in spread]
    assert xs[0] == pytest.approx(0.010) and xs[-1] == pytest.approx(0.015, abs=1e-4)
    assert xs == sorted(xs)
    assert overhead_spread([host], []) == []


def test_each_served_request_draws_its_time_outside_hostd_from_the_spread():
    """With no loads to wait for and instant compute, the simulated latencies are the spread's draws: the
    median and the tail of the spread come back, where a constant would give one value."""
    from dataclasses import replace

    import numpy as np

    from sim.cluster import Cluster, ClusterConfig
    from sim.costs import ComputeCost
    from tests.sim.conftest import make_workload

    wl = make_workload(["a"] * 2000, {"a": 1})
    spread = {"request_overhead_s": 0.003, "request_overhead_spread": [[0.002, 0.0], [0.003, 0.5], [0.004, 0.9],
                                                                        [0.020, 1.0]]}
    cm = replace(calibrate(spread), load_fixed_s=0.0, compute_default=ComputeCost(0.0, 0.0))
    res = Cluster(wl, ClusterConfig(device_bytes=10), cm).run().total
    lat = np.asarray(res.latencies)
    assert np.percentile(lat, 50) == pytest.approx(0.003, abs=2e-4)
    assert 0.004 < np.percentile(lat, 99) < 0.020 and lat.min() >= 0.002
    assert cm.overhead_seconds(0.95) == pytest.approx(0.012)
    assert replace(cm, overhead_spread=()).overhead_seconds(0.95) == 0.003  # no spread: the constant


def _served(overhead_ms: float, load_ms: float) -> dict:
    return {"status": "OK", "total_ms": overhead_ms + load_ms + 1.0, "load_ms": load_ms, "queue_ms": 0.5,
            "compute_ms": 0.5}


def test_the_access_log_gives_one_spread_for_requests_that_waited_on_a_load_and_one_for_the_others():
    """A request whose load_ms is more than a ready model's microseconds waited on a load: its overhead goes
    into request_overhead_spread_loaded, the others' into request_overhead_spread."""
    from sim.calibrate import MIN_LOADED_REQUESTS, overhead_spread_from_log, overhead_spreads_from_log

    ready = [_served(2.0 + i / 100, 0.004) for i in range(100)]  # 2 .. 3 ms, load_ms of a ready model
    waited = [_served(20.0 + i / 10, 80.0) for i in range(30)]  # 20 .. 23 ms, after an 80 ms load
    got = overhead_spreads_from_log(ready + waited + [{"status": "UNAVAILABLE", "total_ms": 900.0, "load_ms": 0}])
    assert set(got) == {"request_overhead_spread", "request_overhead_spread_loaded"}
    r, w = got["request_overhead_spread"], got["request_overhead_spread_loaded"]
    assert (r[0][0], r[-1][0]) == (pytest.approx(0.002), pytest.approx(0.00299))
    assert (w[0][0], w[-1][0]) == (pytest.approx(0.020), pytest.approx(0.0229))
    # too few that waited to describe their spread: one spread of every request, as before
    few = ready + waited[:MIN_LOADED_REQUESTS - 1]
    assert overhead_spreads_from_log(few) == {"request_overhead_spread": overhead_spread_from_log(few)}
    assert overhead_spread_from_log(few)[-1][0] == pytest.approx(0.0218)  # the slowest that waited is in it
    assert overhead_spreads_from_log([]) == {}


def test_calibration_with_an_access_log_writes_both_spreads_into_a_config_sim_run_accepts():
    s = series()
    recs = [_served(2.0, 0.0)] * 50 + [_served(30.0, 50.0)] * 25
    cfg = calibrate_cluster([s], [[RouterScrape(), RouterScrape(9.0, 300.0)]], access_log=recs)
    cm = SimConfig.model_validate(cfg).cost_model()
    assert cm.overhead_seconds(0.5) == pytest.approx(0.002)
    assert cm.overhead_seconds(0.5, loaded=True) == pytest.approx(0.030)
    no_log = calibrate_cluster([s], [[RouterScrape(), RouterScrape(9.0, 300.0)]])  # from metrics: no split
    assert "request_overhead_spread_loaded" not in no_log["costs"]


def test_a_request_that_waited_on_a_load_draws_from_the_loaded_spread_and_the_others_from_theirs():
    """One model, a 1 s load: the requests that come during it wait and add the loaded spread's 50 ms; those
    that come after find it ready and add 1 ms. A config with one spread gives every request that one."""
    from dataclasses import replace

    import numpy as np

    from sim.cluster import Cluster, ClusterConfig
    from sim.costs import ComputeCost
    from sim.workload import ModelSpec, Workload

    wl = Workload([ModelSpec("t/m/1", "t", 10)], np.array([0.0, 0.5, 2.0, 3.0]), np.zeros(4, dtype=np.int64))
    spreads = {"request_overhead_spread": [[0.001, 0.0], [0.001, 1.0]],
               "request_overhead_spread_loaded": [[0.050, 0.0], [0.050, 1.0]]}
    base = replace(calibrate({"load_fixed_s": 1.0, "load_s_per_byte": {"storage": 0.0}}),
                   compute_default=ComputeCost(0.0, 0.0))
    split = replace(base, **{k: v for k, v in calibrate(spreads).__dict__.items() if "overhead_spread" in k})
    lat = Cluster(wl, ClusterConfig(device_bytes=100), split).run().total.latencies
    assert sorted(lat) == pytest.approx([0.001, 0.001, 0.5 + 0.050, 1.0 + 0.050])
    one = replace(split, overhead_spread_loaded=())  # the config format before the split
    assert sorted(Cluster(wl, ClusterConfig(device_bytes=100), one).run().total.latencies) == pytest.approx(
        [0.001, 0.001, 0.501, 1.001])
    # by how long it waited: the request at 0 waited 1 s (over the 0.75 s bound: 100 ms), the one at 0.5 s
    # waited 0.5 s (10 ms); the requests that did not wait keep their own spread
    by_wait = calibrate({**spreads, "request_overhead_by_wait": [[0.75, [[0.010, 0.0], [0.010, 1.0]]],
                                                                 [None, [[0.100, 0.0], [0.100, 1.0]]]]})
    binned = replace(split, overhead_by_wait=by_wait.overhead_by_wait)
    lat = Cluster(wl, ClusterConfig(device_bytes=100), binned).run().total.latencies
    assert lat == pytest.approx([1.0 + 0.100, 0.5 + 0.010, 0.001, 0.001])


def test_the_loaded_spread_by_wait_has_bins_of_equal_counts_by_load_wait():
    """90 requests that waited 10, 20 or 30 ms (30 each) on a load, paying 1, 2 or 3 ms outside hostd: three
    bins, bounded at the waits that end each, each with its own requests' spread."""
    from sim.calibrate import by_wait, overhead_spreads_from_log

    waited = [_served(float(k), 10.0 * k) for k in (3, 1, 2) for _ in range(30)]
    ready = [_served(0.5, 0.0)] * 10
    got = overhead_spreads_from_log(ready + waited)["request_overhead_by_wait"]
    assert [b for b, _ in got] == [pytest.approx(0.010), pytest.approx(0.020), None]
    assert [(s[0][0], s[-1][0]) for _, s in got] == [(pytest.approx(k / 1e3), pytest.approx(k / 1e3)) for k in (1, 2, 3)]
    cm = calibrate(overhead_spreads_from_log(ready + waited))
    assert [cm.overhead_seconds(0.5, True, w) for w in (0.005, 0.010, 0.015, 0.025, 9.0)] == pytest.approx(
        [0.001, 0.001, 0.002, 0.003, 0.003])
    assert cm.overhead_seconds(0.5) == pytest.approx(0.0005)
    assert len(by_wait([0.001] * 5, [0.1] * 5, bins=2)) == 2
    # fewer than 3 x 20 that waited: no bins, the one loaded spread
    assert "request_overhead_by_wait" not in overhead_spreads_from_log(ready + waited[:59])


def test_reloads_prepacked_after_ready_calibrate_their_own_cost_per_byte():
    s = series()
    # two reloads prepacked, 0.2 s in all: 0.1 s each, per byte of the mean load (25 MB over 9 loads)
    s[-1].phases["prepack"], s[-1].phase_counts["prepack"] = 0.2, 2.0
    c = calibrate_cluster([s])["costs"]
    assert c["prepack_s_per_byte"] == pytest.approx(0.1 / (25 * MB / 9))
    assert "prepack_s_per_byte" not in calibrate_cluster([series()])["costs"]  # a hostd that defers nothing
