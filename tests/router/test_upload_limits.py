"""Bounds on one upload (router/uploads.py), with stand-in workers and clients: a validation worker that floods
its output is killed and the model refused (model_invalid) without the router holding what it wrote; an upload
must be whole within a total time, however regularly its client sends a byte; a version the router numbers
itself is not looked up again; instance_count 0 and 1 mean the same to the router."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time

import pytest

import router.uploads as uploads
from ground.errors import AlreadyExists, DeadlineExceeded, Internal, InvalidArgument
from ground.settings import RouterSettings
from protos import uploads_pb2 as pb
from router.metrics import RouterMetrics
from router.uploads import Uploads, read_header, receive_limit_s


def _uploads(code: str = "", timeout_s: float = 30.0, idle_s: float = 30.0, max_bytes: str = "1GiB",
             repo=None) -> Uploads:
    s = RouterSettings(plaintext=True, upload_validate_timeout_s=timeout_s, upload_idle_timeout_s=idle_s,
                       upload_max_bytes=max_bytes)
    return Uploads(settings=s, authenticate=lambda c: "acme", repo=repo, catalog=None, directory=None,  # type: ignore[arg-type]
                   metrics=RouterMetrics(), validator=(sys.executable, "-c", code))


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


FLOOD = """
import os, sys
sys.stdin.read()
open(sys.argv[1] if len(sys.argv) > 1 else {pidfile!r}, "w").write(str(os.getpid()))
w = getattr(sys, {stream!r}).buffer
while True:
    w.write(b"x" * 65536)
    w.flush()
"""


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_a_worker_flooding_its_output_is_killed_and_the_model_refused(tmp_path, stream):
    pidfile = tmp_path / "pid"
    u = _uploads(FLOOD.format(pidfile=str(pidfile), stream=stream))
    t0 = time.monotonic()
    with pytest.raises(InvalidArgument) as e:
        asyncio.run(u._validate({"model": "m"}))
    assert e.value.reason == "model_invalid" and stream in e.value.message
    assert time.monotonic() - t0 < 20, "refused at the cap, not at the validation timeout (30 s)"
    assert _gone(int(pidfile.read_text())), "the worker was killed and reaped"


def test_a_child_of_the_worker_holding_its_pipes_does_not_hold_the_upload(tmp_path):
    """The worker hangs and leaves a child with its stdout and stderr: refused at the timeout all the same.
    Both hold on until the test says it is done (a file it writes at the end; at most 60 s if it never does)."""
    pidfile, done = tmp_path / "child", tmp_path / "done"
    code = f"""import os, sys, time
sys.stdin.read()
def hold():
    t = time.monotonic()
    while not os.path.exists({str(done)!r}) and time.monotonic() - t < 60:
        time.sleep(0.05)
if os.fork() == 0:
    open({str(pidfile)!r}, "w").write(str(os.getpid()))
    hold()
    os._exit(0)
hold()
"""
    u = _uploads(code, timeout_s=1.0)
    t0 = time.monotonic()
    try:
        with pytest.raises(InvalidArgument) as e:
            asyncio.run(u._validate({"model": "m"}))
        assert e.value.reason == "model_invalid" and time.monotonic() - t0 < 20
    finally:
        done.write_text("")
        if pidfile.exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pidfile.read_text()), signal.SIGKILL)


def test_only_the_tail_of_a_long_stderr_is_kept():
    code = ("import sys; sys.stdin.read(); sys.stderr.write('a' * (3 << 20)); sys.stderr.write('THE END');"
            "sys.stderr.flush(); sys.exit(3)")
    with pytest.raises(Internal) as e:
        asyncio.run(_uploads(code)._validate({"model": "m"}))
    assert e.value.detail.endswith("THE END") and len(e.value.detail) < 2100


def test_a_worker_answering_within_the_caps_is_heard():
    code = ('import json, sys; sys.stdin.read(); sys.stderr.write("w" * (2 << 20)); '
            'print(json.dumps({"refused": "no good"}))')
    with pytest.raises(InvalidArgument) as e:
        asyncio.run(_uploads(code)._validate({"model": "m"}))
    assert e.value.message == "model refused: no good"


def test_the_receive_limit_is_the_size_at_the_minimum_rate_plus_the_idle_timeout():
    rate = uploads.MIN_UPLOAD_BYTES_PER_S
    assert receive_limit_s(rate * 10, 1 << 30, 30.0) == pytest.approx(40.0)
    assert receive_limit_s(0, rate * 100, 30.0) == pytest.approx(130.0)  # no size stated: the largest allowed


def _header(**kw) -> bytes:
    return pb.PublishRequest(header=pb.PublishHeader(model="m", **kw)).SerializeToString()


def test_a_trickling_upload_is_cut_at_its_total_limit(monkeypatch):
    """A byte every 0.1 s never trips the idle timeout (0.5 s); the total limit (0.5 s + 1000 bytes at 1000
    bytes/s here) ends it, and its place is given back."""
    monkeypatch.setattr(uploads, "MIN_UPLOAD_BYTES_PER_S", 1000)
    u = _uploads(idle_s=0.5)

    async def trickle():
        yield _header(size_bytes=1000)
        while True:
            await asyncio.sleep(0.1)
            yield pb.PublishRequest(chunk=b"x").SerializeToString()

    async def go():
        return await asyncio.wait_for(u.publish(trickle(), None), 20)

    t0 = time.monotonic()
    with pytest.raises(DeadlineExceeded) as e:
        asyncio.run(go())
    took = time.monotonic() - t0
    assert "not whole within 1.5 s" in e.value.message and 1.3 < took < 5
    assert u.slots.busy == set()
    assert u.metrics.uploads.labels("acme", "deadline")._value.get() == 1


class _Storage:
    def list_dirs(self, prefix: str) -> list[str]:
        return ["1", "2"]


class _Repo:
    storage = _Storage()

    def __init__(self) -> None:
        self.listed = 0

    def versions(self, tenant: str, model: str) -> list[str]:
        self.listed += 1
        return ["1", "2"]


ECHO = 'import json, sys; r = json.load(sys.stdin); print(json.dumps({"refused": "asked for " + r["version"]}))'


def _one_file(**kw):
    async def it():
        yield _header(**kw)
        yield pb.PublishRequest(chunk=b"bytes").SerializeToString()
    return it()


def test_a_numbered_version_is_not_looked_up_again():
    repo = _Repo()
    u = _uploads(ECHO, repo=repo)
    with pytest.raises(InvalidArgument) as e:
        asyncio.run(u.publish(_one_file(), None))
    assert e.value.message == "model refused: asked for 3" and repo.listed == 0


def test_a_named_version_that_exists_is_refused_before_validation():
    repo = _Repo()
    u = _uploads(ECHO, repo=repo)
    with pytest.raises(AlreadyExists) as e:
        asyncio.run(u.publish(_one_file(version="2"), None))
    assert e.value.reason == "version_exists" and repo.listed == 1


def test_instance_count_one_and_unset_are_the_same_request():
    """Why `mmhost upload --router` sends --instance-count 1 as it is (no remap to 0): the router reads 0 as 1,
    and the validator reads 1 as "the config's, else 1"."""
    one = read_header(_header(instance_count=1), "acme", 1 << 20)[1]
    unset = read_header(_header(), "acme", 1 << 20)[1]
    assert one == unset and one["instance_count"] == 1
