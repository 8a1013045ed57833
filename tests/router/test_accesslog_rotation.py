"""The access log's rotation when it goes wrong: the file moved away under the router, or a rename refused.
A file is open afterwards, the lines after it are written, and the writer thread lives on."""

from __future__ import annotations

import json
import os
import time

import pytest

import router.accesslog as accesslog
from router.accesslog import AccessLog


def _write(log: AccessLog, n: int, model: str = "m") -> None:
    for i in range(n):
        log.write(ts=1.0 + i, tenant="acme", model=model, version="1", host="h:1", total_ms=1.0, status="OK",
                  bytes_in=10, bytes_out=20, id=f"r{i}", size_bytes=1234)


def _models(path) -> list[str]:
    return [json.loads(line)["model"] for line in path.read_text().splitlines()]


def test_a_file_moved_away_is_started_again_at_the_next_rotation(tmp_path):
    path = tmp_path / "access.jsonl"
    log = AccessLog.open(str(path), max_bytes=1000, backups=2)
    _write(log, 2, model="before")
    log.flush()
    path.rename(tmp_path / "elsewhere.jsonl")  # by hand, or by another rotator
    _write(log, 5, model="moved")  # still written to the moved file; past max_bytes, a rotation
    log.flush()
    _write(log, 1, model="after")
    log.close()
    assert _models(path) == ["after"]
    assert _models(tmp_path / "elsewhere.jsonl") == ["before"] * 2 + ["moved"] * 5


def test_a_refused_rename_keeps_appending_to_the_same_file(tmp_path, monkeypatch):
    path = tmp_path / "access.jsonl"
    log = AccessLog.open(str(path), max_bytes=1000, backups=2)

    def refused(src, dst):
        raise PermissionError(13, "Permission denied", src)

    monkeypatch.setattr(accesslog.os, "replace", refused)
    _write(log, 5, model="first")
    with pytest.raises(OSError):
        log.flush()  # the batch is written, the rotation fails: the caller learns of it
    assert log.dropped == 0
    _write(log, 1, model="second")
    with pytest.raises(OSError):
        log.flush()  # still over max_bytes: rotation tried again, and written all the same
    monkeypatch.undo()
    _write(log, 1, model="third")
    log.flush()  # the rename works again: rotated
    _write(log, 1, model="fourth")
    log.close()
    assert _models(tmp_path / "access.jsonl.1") == ["first"] * 5 + ["second", "third"]
    assert _models(path) == ["fourth"]


def test_a_file_that_cannot_be_reopened_drops_lines_until_it_can(tmp_path, monkeypatch):
    path = tmp_path / "access.jsonl"
    log = AccessLog.open(str(path), max_bytes=1000, backups=1)
    real_open = open
    broken = {"on": True}

    def failing_open(file, *a, **kw):
        if broken["on"] and str(file) == str(path):
            raise OSError(28, "No space left on device")
        return real_open(file, *a, **kw)

    monkeypatch.setattr(accesslog, "open", failing_open, raising=False)
    _write(log, 5, model="rotated")
    with pytest.raises(OSError):
        log.flush()  # written, then renamed to .1; the new file cannot be opened
    _write(log, 2, model="lost")
    with pytest.raises(OSError):
        log.flush()  # a closed file is not written to (no ValueError): opened again, which fails
    assert log.dropped == 2
    broken["on"] = False
    _write(log, 1, model="back")
    log.close()
    assert _models(path) == ["back"]
    assert _models(tmp_path / "access.jsonl.1") == ["rotated"] * 5


def test_the_writer_thread_survives_a_failed_rotation(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(accesslog, "FLUSH_S", 0.01)
    path = tmp_path / "access.jsonl"
    log = AccessLog.open(str(path), max_bytes=500, backups=1)
    calls = {"n": 0}
    real_replace = os.replace

    def fails_once(src, dst):
        calls["n"] += 1
        if calls["n"] == 1:
            raise FileNotFoundError(2, "No such file or directory", src)
        real_replace(src, dst)

    monkeypatch.setattr(accesslog.os, "replace", fails_once)
    log.start()
    _write(log, 5, model="a")
    deadline = time.monotonic() + 10
    while calls["n"] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    _write(log, 3, model="b")  # written by the same thread, then rotated (the rename works now)
    backup = tmp_path / "access.jsonl.1"
    deadline = time.monotonic() + 10
    while not (backup.exists() and len(_models(backup)) == 8) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert log._thread is not None and log._thread.is_alive()
    log.close()
    assert _models(backup) == ["a"] * 5 + ["b"] * 3 and _models(path) == []
    assert capsys.readouterr().err.count("access log:") == 1  # said once
