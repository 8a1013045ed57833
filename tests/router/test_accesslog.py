"""The access log's file side: every line has every field, lines wait in memory (bounded, drops counted) until
the writer writes them, a file rotates by size, and close() writes what is left."""

from __future__ import annotations

import io
import json

import pytest

from router.accesslog import FIELDS, AccessLog


def _write(log: AccessLog, n: int, model: str = "m") -> None:
    for i in range(n):
        log.write(ts=1.0 + i, tenant="acme", model=model, version="1", host="h:1", total_ms=1.0, status="OK",
                  bytes_in=10, bytes_out=20, id=f"r{i}", size_bytes=1234)


def test_lines_wait_for_the_writer_and_carry_every_field_in_order():
    out = io.StringIO()
    log = AccessLog(out)
    _write(log, 3)
    assert out.getvalue() == ""  # nothing encoded or written on the request's path
    log.flush()
    recs = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [list(r) for r in recs] == [list(FIELDS)] * 3
    assert [r["id"] for r in recs] == ["r0", "r1", "r2"]
    assert (recs[0]["size_bytes"], recs[0]["reason"], recs[0]["queue_ms"]) == (1234, "", None)


def test_past_max_pending_lines_are_dropped_and_counted():
    dropped: list[int] = []
    out = io.StringIO()
    log = AccessLog(out, max_pending=5, on_drop=dropped.append)
    _write(log, 8)
    log.flush()
    assert len(out.getvalue().splitlines()) == 5 and log.dropped == 3 and sum(dropped) == 3


def test_a_file_rotates_past_max_bytes_and_keeps_backups(tmp_path):
    path = tmp_path / "access.jsonl"
    log = AccessLog.open(str(path), max_bytes=1000, backups=2)
    for _ in range(4):  # each batch is about 1.2 KB: a rotation after each
        _write(log, 5)
        log.flush()
    _write(log, 1, model="last")
    log.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["access.jsonl", "access.jsonl.1", "access.jsonl.2"]
    assert [json.loads(x)["model"] for x in path.read_text().splitlines()] == ["last"]
    assert len((tmp_path / "access.jsonl.1").read_text().splitlines()) == 5


def test_the_writer_thread_writes_and_close_flushes_the_rest(tmp_path):
    path = tmp_path / "a.jsonl"
    log = AccessLog.open(str(path))
    log.start()
    _write(log, 50)
    log.close()
    assert len(path.read_text().splitlines()) == 50
    log.write(ts=1.0, tenant="t", model="m", version="", host="", total_ms=0.0, status="OK", bytes_in=0,
              bytes_out=0, id="")  # after close: off, no error


def test_lines_of_a_failed_write_are_counted_as_dropped():
    class Full(io.StringIO):
        def write(self, s):
            raise OSError(28, "No space left on device")

    dropped: list[int] = []
    log = AccessLog(Full(), on_drop=dropped.append)
    _write(log, 4)
    with pytest.raises(OSError):
        log.flush()  # the caller learns of it too
    assert log.dropped == 4 and dropped == [4]
