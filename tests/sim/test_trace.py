import json

import pytest

from sim.cache_only import run_cache_only
from sim.trace import read_trace, write_trace

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
    bad = _write(tmp_path / "bad.jsonl", LINES[:2], extra='{"ts": 5, "tenant": "x"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:4: .*missing model, version"):
        read_trace(bad)
