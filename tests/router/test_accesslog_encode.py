"""The access log's encoding, in its writer thread: the hostd's `mmhost-served` trailer is queued as it came and
decoded there, into the same line the router wrote when it decoded it on the event loop; a line is ASCII, so
the size counted for rotation is the file's size."""

from __future__ import annotations

import io
import json
import random

from ground.served import Served
from router.accesslog import AccessLog


def _line(**kw) -> str:
    lines: list[str] = []

    class Out:
        closed = False

        def write(self, s: str) -> None:
            lines.append(s)

        def flush(self) -> None:
            pass

    log = AccessLog(Out())  # type: ignore[arg-type]
    log.write(ts=1717000000.123456, tenant="acme", model="mlp", host="10.0.0.5:8001", total_ms=1.92, status="OK",
              bytes_in=1324, bytes_out=108, id="req-7", **kw)
    log.flush()
    return "".join(lines)


def _as_before(s: Served) -> str:
    """The line as the servicer wrote it before: decoded on the event loop, seconds back to milliseconds."""
    d = Served.decode(s.encode())
    assert d is not None
    return _line(version=d.version, size_bytes=d.size_bytes, load_ms=d.load_s * 1000, queue_ms=d.queue_s * 1000,
                 compute_ms=d.compute_s * 1000)


def test_the_trailer_is_queued_as_it_came_and_decoded_by_the_writer():
    raw = Served("3", 5_300_000, 0.25, 0.0015, 0.002).encode()
    log = AccessLog(io.StringIO())
    log.write(ts=1.0, tenant="acme", model="mlp", version="", host="", total_ms=0.0, status="OK", bytes_in=0,
              bytes_out=0, id="", served=raw)
    assert log._pending[0][-1] == raw  # nothing decoded on the request's path
    rec = json.loads(_line(version="", served=raw))
    assert (rec["version"], rec["size_bytes"], rec["load_ms"], rec["queue_ms"], rec["compute_ms"]) == (
        "3", 5_300_000, 250.0, 1.5, 2.0)


def test_the_line_is_byte_identical_to_the_one_decoded_on_the_event_loop():
    rng = random.Random(7)
    cases = [Served("3", 5_300_000, 0.25, 0.0015, 0.002), Served("", 0, 0.0, 0.0, 0.0),
             Served("v1.2", 1, 1e-7, 12.3456789, 0.0004996)]
    cases += [Served(str(rng.randrange(100)), rng.randrange(1 << 40), rng.random() * 10, rng.random() / 100,
                     rng.random()) for _ in range(2000)]
    for s in cases:
        assert _line(version="asked", served=s.encode()) == _as_before(s), s


def test_a_malformed_trailer_keeps_what_the_router_knows():
    rec = json.loads(_line(version="1", size_bytes=None, served="v=2;b=oops"))
    assert (rec["version"], rec["size_bytes"], rec["load_ms"]) == ("1", None, None)


def test_a_line_is_ascii_so_its_characters_are_its_bytes(tmp_path):
    path = tmp_path / "a.jsonl"
    log = AccessLog.open(str(path), max_bytes=1 << 20)
    for model in ("mlp", "modèle", "模型", "\U0001f600"):
        log.write(ts=1.0, tenant="tenant-é", model=model, version="1", host="", total_ms=0.0, status="OK",
                  bytes_in=0, bytes_out=0, id="ü")
    log.flush()
    text = path.read_text(encoding="utf-8")
    assert text.isascii() and log._size == path.stat().st_size
    assert [json.loads(x)["model"] for x in text.splitlines()] == ["mlp", "modèle", "模型", "\U0001f600"]
    log.close()
