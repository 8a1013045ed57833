"""`mmhost sim calibrate`'s fitting (sim/calibrate.py) on hand-made scrapes: load stages, overhead outside
hostd, and the cluster's settings from its gauges, into a config `sim run` accepts."""

import pytest

from sim.calibrate import RouterScrape, calibrate_cluster, load_samples, parse_router_metrics
from sim.config import SimConfig
from sim.costs import calibrate
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
    assert parse_router_metrics(text) == RouterScrape(0.2, 4.0)


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
