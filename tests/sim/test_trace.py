import json

import pytest

from sim.cache_only import run_cache_only
from sim.trace import read_trace, read_trace_report, write_trace

LINES = [
    {"ts": 100.0, "tenant": "acme", "model": "a", "version": "1", "status": "OK", "total_ms": 3.1, "queue_ms": 0.2,
     "host": "h1", "bytes_in": 10, "bytes_out": 4, "size_bytes": 100},
    {"ts": 101.0, "tenant": "acme", "model": "b", "version": "1", "size_bytes": 100},
    {"ts": 100.5, "tenant": "zeta", "model": "a", "version": "2"},  # out of order; no size: default
    {"ts": 102.0, "tenant": "acme", "model": "a", "version": "1", "size_bytes": 120},  # larger measurement wins
    {"ts": 103.0, "tenant": "acme", "model": "c", "version": "1", "size_bytes": 100},
    {"ts": 104.0, "tenant": "acme", "model": "b", "version": "1", "size_bytes": 100},
]


def _write(path, lines, extra=""):
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n" + extra)
    return path


def test_read_trace(tmp_path):
    wl = read_trace(_write(tmp_path / "t.jsonl", LINES), default_size=80)
    assert [m.key for m in wl.models] == ["acme/a/1", "acme/b/1", "zeta/a/2", "acme/c/1"]
    assert [m.size for m in wl.models] == [120, 100, 80, 100]
    assert wl.ts.tolist() == [100.0, 100.5, 101.0, 102.0, 103.0, 104.0]
    assert [wl.models[i].key for i in wl.model] == ["acme/a/1", "zeta/a/2", "acme/b/1", "acme/a/1", "acme/c/1",
                                                    "acme/b/1"]
    assert wl.tenants == ["acme", "zeta"]


def test_replay_hit_counts(tmp_path):
    wl = read_trace(_write(tmp_path / "t.jsonl", LINES), default_size=80)
    # cache 300: a(120) z(80) b(100) fill 300; a hit; c(100) evicts LRU z(80)... then a? LRU order: z, b, a
    #   -> evicting z frees 80, not enough, b too -> c loaded; b misses again, evicts a. 1 hit.
    r = run_cache_only(wl, 300, "lru")
    assert (r.total.hits, r.total.loads) == (1, 5)
    assert r.tenants["acme"].hits == 1 and r.tenants["zeta"].loads == 1
    # big enough for all: every first request is the only miss
    r = run_cache_only(wl, 10_000, "lru")
    assert (r.total.hits, r.total.loads) == (2, 4)


def test_round_trip_and_bad_line(tmp_path):
    wl = read_trace(_write(tmp_path / "t.jsonl", LINES))
    write_trace(wl, tmp_path / "copy.jsonl")
    again = read_trace(tmp_path / "copy.jsonl")
    assert again.ts.tolist() == wl.ts.tolist() and set(again.models) == set(wl.models)
    assert [again.models[i].key for i in again.model] == [wl.models[i].key for i in wl.model]
    only_bad = _write(tmp_path / "bad.jsonl", [], extra='{"ts": 5, "tenant": "x"}\nnot json\n')
    with pytest.raises(ValueError, match=r"bad.jsonl: no request to replay .*1 not JSON.*1 JSON without"):
        read_trace(only_bad)


def test_non_ok_and_non_json_lines_are_skipped_counted_and_reported(tmp_path):
    lines = [
        {"ts": 1.0, "tenant": "acme", "model": "a", "version": "1", "status": "OK", "size_bytes": 5_300_000},
        {"ts": 2.0, "tenant": "acme", "model": "nope", "version": "", "status": "NOT_FOUND", "reason": "not_found"},
        {"ts": 3.0, "tenant": "acme", "model": "a", "version": "1", "status": "INVALID_ARGUMENT",
         "reason": "invalid_argument", "size_bytes": 5_300_000},
        {"ts": 4.0, "tenant": "acme", "model": "a", "version": "1", "status": "RESOURCE_EXHAUSTED",
         "reason": "quota_rate"},
        {"ts": 5.0, "tenant": "acme", "model": "b", "version": "2", "status": "UNAVAILABLE", "reason": "no_capacity",
         "size_bytes": 75_000},
        {"ts": 6.0, "tenant": "acme", "model": "c", "version": "1", "status": "OK"},  # no size anywhere
    ]
    noise = "2026-12-01 21:00:00 INFO router: serving\n{\"level\": \"info\"}\n[1, 2]\n"
    path = tmp_path / "t.jsonl"
    path.write_text(noise + "\n".join(json.dumps(x) for x in lines) + "\n" + '{"ts": 7, "tenant"')
    wl, rep = read_trace_report(path, default_size=1000)
    assert [(m.key, m.size) for m in wl.models] == [("acme/a/1", 5_300_000), ("acme/c/1", 1000)]
    assert (rep.lines, rep.replayed, rep.non_json, rep.not_trace, rep.first_bad) == (10, 2, 3, 1, 1)
    assert rep.skipped_status == {"NOT_FOUND": 1, "INVALID_ARGUMENT": 1, "RESOURCE_EXHAUSTED": 1, "UNAVAILABLE": 1}
    assert rep.shed == 2 and rep.shed_reasons == {"quota_rate": 1, "no_capacity": 1} and rep.sized_default == ["acme/c/1"]
    text = "\n".join(rep.summary())
    assert "replayed 2 of 10 lines" in text and "3 not JSON (first at line 1)" in text
    assert "shed 2 of 6 requests" in text and "WARNING: 1 model(s) had no size" in text
    # sizes from elsewhere (the store) win over the trace's
    wl, rep = read_trace_report(path, sizes_for=lambda keys: {k: 42 for k in keys})
    assert [m.size for m in wl.models] == [42, 42] and rep.sized_default == []


def test_access_records_keep_the_json_objects_and_skip_the_rest(tmp_path):
    from sim.trace import access_records

    p = tmp_path / "access.jsonl"
    p.write_text('{"status": "OK", "total_ms": 3.0}\nINFO router started\n[1, 2]\n\n{"status": "OK", "total_ms"')
    assert access_records(p) == [{"status": "OK", "total_ms": 3.0}]


def test_several_access_logs_replay_as_one_trace_in_time_order(tmp_path):
    """A router with Python-lane workers writes FILE and FILE.w1 (a fleet: one per router): their records,
    read together, replay as one trace in time order, and a bad line is reported with its file."""
    main = _write(tmp_path / "access.jsonl", LINES[:3])
    worker = _write(tmp_path / "access.jsonl.w1", LINES[3:], extra="not json\n")
    wl, rep = read_trace_report([main, worker], default_size=80)
    whole = read_trace(_write(tmp_path / "one.jsonl", LINES), default_size=80)
    assert wl.ts.tolist() == whole.ts.tolist() == [100.0, 100.5, 101.0, 102.0, 103.0, 104.0]
    assert [wl.models[i].key for i in wl.model] == [whole.models[i].key for i in whole.model]
    assert {m.key: m.size for m in wl.models} == {m.key: m.size for m in whole.models}  # a's 120 from the worker's
    assert (rep.lines, rep.replayed, rep.non_json) == (7, 6, 1)
    assert f"1 not JSON (first at {worker} line 5)" in "\n".join(rep.summary())  # 3 records, a blank line
