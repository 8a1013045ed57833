import numpy as np

from sim.cache_only import run_cache_only
from sim.cluster import ClusterConfig, run_cluster
from sim.workload import SyntheticConfig, generate


def test_same_seed_same_workload_and_result():
    cfg = SyntheticConfig(models=300, requests=20_000, noisy_models=100, noisy_share=0.2, drift_period_s=20.0,
                          arrivals="bursty", seed=7)
    a, b = generate(cfg), generate(cfg)
    assert np.array_equal(a.ts, b.ts) and np.array_equal(a.model, b.model) and a.models == b.models
    for policy in ("lru", "gdsf"):
        ra = run_cache_only(a, a.total_bytes // 10, policy)
        rb = run_cache_only(b, b.total_bytes // 10, policy)
        assert repr(ra.row()) == repr(rb.row()) and repr(ra.tenant_rows()) == repr(rb.tenant_rows())  # nan-safe
    small = a.head(2000)
    cc = ClusterConfig(device_bytes=a.total_bytes // 10, hosts=2)
    assert run_cluster(small, cc).row() == run_cluster(small, cc).row()
    c = generate(cfg.model_copy(update={"seed": 8}))
    assert not np.array_equal(a.model, c.model)


def test_synthetic_shapes():
    wl = generate(SyntheticConfig(models=500, requests=50_000, tenants=3, noisy_models=200, noisy_share=0.25,
                                  size_median=1e8, size_sigma=0.5))
    assert len(wl) == 50_000 and len(wl.models) == 700
    assert wl.tenants == ["noisy", "t0", "t1", "t2"]
    assert np.all(np.diff(wl.ts) >= 0)
    sizes = np.array([m.size for m in wl.models])
    assert 0.7e8 < np.median(sizes) < 1.4e8
    noisy = np.array([wl.models[i].tenant == "noisy" for i in wl.model])
    assert 0.22 < noisy.mean() < 0.28
    counts = np.sort(np.bincount(wl.model[~noisy], minlength=500))[::-1]
    assert counts[0] > 20 * counts[250]  # Zipf: the head is far more popular than the middle
    assert abs(len(wl) / wl.ts[-1] - 100.0) < 5.0  # Poisson at the configured rate


def test_bursty_arrivals_and_drift():
    base = SyntheticConfig(models=100, requests=30_000, rate=50.0, seed=3)
    bursty = generate(base.model_copy(update={"arrivals": "bursty", "burst_prob": 0.2, "burst_factor": 10.0}))
    per_period = np.bincount((bursty.ts // 10.0).astype(int))
    assert per_period.max() > 4 * np.median(per_period)
    drift = generate(base.model_copy(update={"drift_period_s": 100.0, "drift_fraction": 1.0}))
    first = np.bincount(drift.model[drift.ts < 100], minlength=100).argmax()
    last = np.bincount(drift.model[drift.ts >= drift.ts[-1] - 100], minlength=100).argmax()
    assert first != last  # the most popular model changed
