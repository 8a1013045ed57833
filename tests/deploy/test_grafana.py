"""deploy/grafana: every dashboard query names series the code exports, parses as PromQL (promtool), and the
panels on-call needs are there."""

from __future__ import annotations

import json

import yaml

from tests.deploy.conftest import DEPLOY, run, tool
from tests.deploy.promql import grafana_to_promql, metric_names, selectors

DASH = DEPLOY / "grafana" / "mmhost-dashboard.json"


def _targets():
    d = json.loads(DASH.read_text())
    for p in d["panels"]:
        for t in p.get("targets", []):
            yield p["title"], t["expr"]


def test_dashboard_queries_name_only_exported_series(exported):
    for title, expr in _targets():
        names = metric_names(grafana_to_promql(expr))
        assert names, f"panel {title!r}: no series in {expr!r}"
        unknown = names - exported.keys()
        assert not unknown, f"panel {title!r} uses series the code does not export: {sorted(unknown)}"
        for name, labels in selectors(grafana_to_promql(expr)):
            assert labels <= exported[name], f"panel {title!r}: {name} has no label(s) {labels - exported[name]}"
    # Template variables query series too.
    for v in json.loads(DASH.read_text())["templating"]["list"]:
        if v["type"] == "query":
            q = v["query"]["query"]
            series = q.split("(", 1)[1].split(",")[0].split("{")[0].strip()
            assert series in exported, f"variable {v['name']}: {series} is not exported"


def test_dashboard_queries_parse_as_promql(tmp_path):
    """promtool parses each query (Grafana variables substituted) as a recording rule."""
    rules = [{"record": f"dashboard:q{i}", "expr": grafana_to_promql(e)} for i, (_, e) in enumerate(_targets())]
    f = tmp_path / "dash.rules.yaml"
    f.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    r = run([tool("promtool"), "check", "rules", str(f)])
    assert r.returncode == 0, r.stdout + r.stderr


def test_dashboard_covers_what_on_call_needs(exported):
    exprs = " ".join(e for _, e in _targets())
    needed = {
        "request rate": "rate(mmhost_requests_total",
        "latency p50": "histogram_quantile(0.5, sum by (le, tenant, model) (rate(mmhost_request_duration_seconds_bucket",
        "latency p99": "histogram_quantile(0.99, sum by (le, tenant, model) (rate(mmhost_request_duration_seconds_bucket",
        "queue split": "mmhost_queue_duration_seconds_bucket",
        "compute split": "mmhost_compute_duration_seconds_bucket",
        "hit rate by tier": "sum by (tier) (rate(mmhost_cache_hits_total",
        "evictions": "mmhost_cache_evictions_total",
        "loads": "mmhost_model_loads_total",
        "load time": "mmhost_model_load_duration_seconds_bucket",
        "memory vs watermarks": "mmhost_cache_watermark_bytes{level=\"high\"",
        "shed by tenant and reason": "sum by (tenant, reason) (rate(mmhost_requests_shed_total",
    }
    missing = [k for k, v in needed.items() if v not in exprs]
    assert not missing, missing
    d = json.loads(DASH.read_text())
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids)) and d["uid"]


def test_promql_helper_finds_series_and_only_series():
    e = 'sum by (tenant) (rate(foo_total{a="b",c=~"x|y"}[5m] offset 1h)) / on (instance) bar > 1e-9 and up == 0'
    assert metric_names(e) == {"foo_total", "bar", "up"}
    assert selectors(e) == [("foo_total", {"a", "c"})]
    assert metric_names(grafana_to_promql('rate(x_bucket{tenant=~"$tenant"}[$__rate_interval])')) == {"x_bucket"}


def _denominators(expr: str) -> list[str]:
    """The divisor of each `/` at the top level of `expr` (up to the end or an `and`/`or` at depth 0)."""
    out, depth, i = [], 0, 0
    while i < len(expr):
        c = expr[i]
        depth += c in "([{"
        depth -= c in ")]}"
        if c == "/" and depth == 0:
            out.append(expr[i + 1:].strip())
        i += 1
    return out


def test_shed_ratios_use_the_alerts_denominator_everywhere():
    """Every ratio of shed requests, in the dashboard and in the alerts, divides by the requests routers received
    (or hostd's count where no router reports): router refusals are never divided by hostd-only requests, and
    the numerator and denominator cover the same instances."""
    from tests.deploy.test_prometheus import _rules

    want = "(sum by (tenant) (rate(mmhost_router_requests_total"
    shed = [(t, e) for t, e in _targets() if "mmhost_requests_shed_total" in e and "/" in e]
    assert shed, "the dashboard has no shed ratio"
    for title, expr in shed:
        (den,) = _denominators(expr)
        assert den.startswith(want) and "or sum by (tenant) (rate(mmhost_requests_total" in den, (title, den)
        assert "instance" not in expr, f"{title}: an instance filter drops the routers' (or the hostds') half"
    shed_rules = [rule for rule in _rules() if "mmhost_requests_shed_total" in rule["expr"]]
    assert shed_rules, "no alert rule on mmhost_requests_shed_total"
    for rule in shed_rules:
        assert "mmhost_router_requests_total" in rule["expr"], rule["alert"]
