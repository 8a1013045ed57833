"""ground.metrics_merge: one metrics port serving a process's own series and its helper processes' series, each
labelled with its source. Pure merge rules, then the collector with a fetch that fails, then a real HTTP source
read in OpenMetrics, the merged page checked by promtool in both exposition formats."""

from __future__ import annotations

import subprocess

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.parser import text_string_to_metric_families

from ground.metrics_http import serve_metrics
from ground.metrics_merge import MergedCollector, merge_families, merged_registry


def _registry(tenant: str, n: int) -> tuple[CollectorRegistry, Counter]:
    r = CollectorRegistry()
    c = Counter("mmhost_router_requests", "Inference requests", ["tenant"], registry=r)
    c.labels(tenant).inc(n)
    Histogram("mmhost_router_forward_seconds", "Forward time", registry=r, buckets=(0.01, 0.1)).observe(0.05)
    return r, c


def _samples(text: str, name: str) -> dict[tuple, float]:
    return {tuple(sorted(s.labels.items())): s.value for f in text_string_to_metric_families(text)
            for s in f.samples if s.name == name}


def test_sources_samples_join_the_own_families_with_their_label():
    own, _ = _registry("a", 3)
    other, _ = _registry("b", 5)
    merged = merge_families(own.collect(), [("1", other.collect())], "lane_worker")
    names = [f.name for f in merged]
    assert len(names) == len(set(names))  # each family once
    req = next(f for f in merged if f.name == "mmhost_router_requests")
    totals = {tuple(sorted(s.labels.items())): s.value for s in req.samples if s.name.endswith("_total")}
    assert totals == {(("tenant", "a"),): 3.0, (("lane_worker", "1"), ("tenant", "b")): 5.0}
    hist = next(f for f in merged if f.name == "mmhost_router_forward_seconds")
    assert {s.labels.get("lane_worker") for s in hist.samples} == {None, "1"}
    assert sum(1 for s in hist.samples if s.name.endswith("_count")) == 2


def test_a_family_of_another_type_and_samples_with_the_label_already_are_left_out():
    own = CollectorRegistry()
    Gauge("x", "a gauge here", registry=own).set(1)
    other = CollectorRegistry()
    Counter("x", "a counter there", registry=other).inc()
    g = Gauge("y", "y", ["lane_worker"], registry=other)
    g.labels("9").set(2)
    Gauge("z", "only there", registry=other).set(7)
    merged = {f.name: f for f in merge_families(own.collect(), [("1", other.collect())], "lane_worker")}
    assert [s.value for s in merged["x"].samples] == [1.0] and merged["x"].type == "gauge"
    assert merged["y"].samples == []  # a sample may not say it comes from another source
    assert [(s.labels, s.value) for s in merged["z"].samples] == [({"lane_worker": "1"}, 7.0)]


def test_a_source_that_cannot_be_read_is_left_out_and_counted():
    own, _ = _registry("a", 1)
    failed: list[str] = []

    def fetch(url: str, timeout: float):
        raise ConnectionRefusedError(111, "Connection refused")

    reg = merged_registry(MergedCollector(own, lambda: [("1", "http://127.0.0.1:1/metrics")], "lane_worker",
                                          on_failure=failed.append, fetch=fetch))
    text = generate_latest(reg).decode()
    assert failed == ["1"]
    assert _samples(text, "mmhost_router_requests_total") == {(("tenant", "a"),): 1.0}


def test_a_source_not_serving_now_is_counted_without_a_read():
    """A worker restarting has no port yet (the one it had is free for anyone): no fetch, but counted."""
    own, _ = _registry("a", 1)
    failed: list[str] = []
    fetched: list[str] = []

    def fetch(url: str, timeout: float):
        fetched.append(url)
        return []

    reg = merged_registry(MergedCollector(own, lambda: [("1", None), ("2", "http://127.0.0.1:9/metrics")],
                                          "lane_worker", on_failure=failed.append, fetch=fetch))
    generate_latest(reg)
    assert (failed, fetched) == (["1"], ["http://127.0.0.1:9/metrics"])


def test_a_real_source_is_read_over_http_and_the_page_is_valid_in_both_formats():
    own, _ = _registry("a", 2)
    other, counter = _registry("b", 4)
    server = serve_metrics("127.0.0.1", 0, other)
    try:
        url = f"http://127.0.0.1:{server.port}/metrics"
        reg = merged_registry(MergedCollector(own, lambda: [("1", url)], "lane_worker"))
        text = generate_latest(reg).decode()
        assert _samples(text, "mmhost_router_requests_total") == {
            (("tenant", "a"),): 2.0, (("lane_worker", "1"), ("tenant", "b")): 4.0}
        counter.labels("b").inc()  # read again at each scrape
        assert _samples(generate_latest(reg).decode(), "mmhost_router_requests_total")[
            (("lane_worker", "1"), ("tenant", "b"))] == 5.0
        for page in (text.encode(), generate_openmetrics(reg)):
            check = subprocess.run(["promtool", "check", "metrics"], input=page, capture_output=True, timeout=30)
            # promtool's lint warns about naming (exit 3); a page it cannot parse is exit 1
            assert check.returncode in (0, 3) and b"error while linting" not in check.stderr, check.stderr
    finally:
        server.close()


def test_sources_are_read_at_once_and_kept_in_order():
    import threading

    own, _ = _registry("a", 1)
    started = threading.Barrier(3, timeout=5)  # all three reads in flight together, or the barrier breaks
    others = {str(i): _registry(f"t{i}", i)[0] for i in (1, 2, 3)}

    def fetch(url: str, timeout: float):
        started.wait()
        return list(others[url].collect())

    reg = merged_registry(MergedCollector(own, lambda: [(i, i) for i in ("1", "2", "3")], "lane_worker", fetch=fetch))
    text = generate_latest(reg).decode()
    assert _samples(text, "mmhost_router_requests_total") == {
        (("tenant", "a"),): 1.0, **{(("lane_worker", i), ("tenant", f"t{i}")): float(i) for i in ("1", "2", "3")}}
