import json

import pytest

from sim.costs import ComputeCost, CostModel, calibrate


def test_cost_model_arithmetic():
    cm = CostModel(load_fixed_s=0.5, load_s_per_byte={"storage": 1e-8, "disk": 1e-9, "host_ram": 1e-10},
                   compute={"m": ComputeCost(0.01, 0.002)})
    assert cm.load_seconds(100_000_000, "storage") == pytest.approx(1.5)
    assert cm.load_seconds(100_000_000, "host_ram") == pytest.approx(0.51)
    assert cm.batch_seconds("m", 8) == pytest.approx(0.026)
    assert cm.batch_seconds("other", 1) == pytest.approx(0.0025)  # default compute cost


def test_calibrate_from_direct_numbers_and_samples(tmp_path):
    data = {
        "load_s_per_byte": {"host_ram": 2e-10},
        "compute_default": {"fixed_s": 0.003, "per_item_s": 0.001},
        "loads": [{"tier": "storage", "bytes": b, "seconds": 0.2 + b * 4e-9} for b in (1e7, 5e7, 1e8)],
        "batches": [{"model": "acme/m/1", "size": n, "seconds": 0.004 + n * 0.0005} for n in (1, 4, 16)],
    }
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(data))
    cm = calibrate(path)
    assert cm.load_s_per_byte["storage"] == pytest.approx(4e-9)
    assert cm.load_fixed_s == pytest.approx(0.2)
    assert cm.load_s_per_byte["host_ram"] == pytest.approx(2e-10)
    assert cm.compute["acme/m/1"].fixed_s == pytest.approx(0.004)
    assert cm.compute["acme/m/1"].per_item_s == pytest.approx(0.0005)
    assert cm.batch_seconds("x", 2) == pytest.approx(0.005)
    with pytest.raises(ValueError, match="unknown tier"):
        calibrate({"loads": [{"tier": "tape", "bytes": 1, "seconds": 1}]})


def test_counted_load_samples_recover_fixed_and_per_byte():
    # totals over several loads each (two scrapes apart): seconds = count * 0.01 + 2e-9 * bytes
    from sim.costs import calibrate as cal

    pts = [(1, 1e6), (3, 9e6), (2, 2e6), (5, 30e6)]
    cm = cal({"loads": [{"tier": "disk", "count": c, "bytes": b, "seconds": c * 0.01 + 2e-9 * b} for c, b in pts],
              "request_overhead_s": 0.001})
    assert cm.load_fixed_s == pytest.approx(0.01) and cm.load_s_per_byte["disk"] == pytest.approx(2e-9)
    assert cm.request_overhead_s == 0.001


def test_request_overhead_is_added_to_every_simulated_latency():
    import numpy as np

    from sim.cluster import ClusterConfig, run_cluster
    from sim.workload import ModelSpec, Workload

    wl = Workload([ModelSpec("t/m/1", "t", 10)], np.array([0.0, 5.0]), np.array([0, 0]))
    base = CostModel(load_fixed_s=1.0, load_s_per_byte={"storage": 0.0, "disk": 0.0, "host_ram": 0.0},
                     compute_default=ComputeCost(0.01, 0.0))
    plus = CostModel(**{**base.__dict__, "request_overhead_s": 0.002})
    a = run_cluster(wl, ClusterConfig(device_bytes=100), base).total.latencies
    b = run_cluster(wl, ClusterConfig(device_bytes=100), plus).total.latencies
    assert a == pytest.approx([1.01, 0.01]) and b == pytest.approx([1.012, 0.012])
