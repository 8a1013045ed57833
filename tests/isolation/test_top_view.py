"""mmhost top's numbers from two snapshots: hit rate and shed/request rates from counter deltas."""

from __future__ import annotations

from rich.console import Console

from mmhost.top_view import Snapshot, rates, render
from protos import hostd_control_pb2 as hc


def status(addr: str, hits: int, misses: int, shed: dict, reqs: dict) -> hc.HostStatus:
    return hc.HostStatus(address=addr, cache_hits=hits, cache_misses=misses, shed_by_tenant=shed,
                         requests_by_tenant=reqs, models=[hc.ModelStatus(tenant="a", model="m", state="READY")])


def test_rates_from_deltas_between_snapshots_across_hosts():
    prev = Snapshot(10.0, {"h1": status("h1", 90, 10, {"a": 5}, {"a": 100}), "h2": status("h2", 0, 0, {}, {"b": 10})})
    cur = Snapshot(12.0, {"h1": status("h1", 96, 14, {"a": 25}, {"a": 140}), "h2": status("h2", 0, 0, {"b": 2}, {"b": 30}),
                          "h3": None})
    r = rates(cur, prev)
    assert r.hit_rate_recent == 0.6 and abs(r.hit_rate_total - 96 / 110) < 1e-9
    assert r.shed_per_s == {"a": 10.0, "b": 1.0} and r.shed_total == {"a": 25, "b": 2}
    assert r.requests_per_s == {"a": 20.0, "b": 10.0}
    first = rates(cur, None)
    assert first.hit_rate_recent is None and first.shed_per_s == {} and first.requests_total == {"a": 140, "b": 30}


def test_a_restarted_host_counts_from_zero_not_negative():
    prev = Snapshot(0.0, {"h1": status("h1", 100, 0, {"a": 50}, {"a": 500})})
    cur = Snapshot(1.0, {"h1": status("h1", 3, 1, {"a": 2}, {"a": 4})})
    r = rates(cur, prev)
    assert r.shed_per_s == {"a": 2.0} and r.requests_per_s == {"a": 4.0} and r.hit_rate_recent == 0.75


def test_render_names_down_hosts_and_tenants():
    cur = Snapshot(1.0, {"h1": status("h1", 1, 1, {"a": 3}, {"a": 9}), "h9": None}, "test")
    c = Console(width=200, record=True)
    c.print(render(cur, None))
    text = c.export_text()
    assert "h9" in text and "DOWN" in text and "50.0% since start" in text and "a" in text
