"""The access log: one JSON line per inference request, a trace sim/trace.py replays (`mmhost sim run --trace`).

    {"ts":1717000000.123456,"tenant":"acme","model":"mlp","version":"1","size_bytes":5300000,
     "host":"10.0.0.5:8001","status":"OK","reason":"","load_ms":0.0,"queue_ms":0.12,"compute_ms":1.3,
     "total_ms":1.92,"bytes_in":1324,"bytes_out":108,"id":"req-7"}

Every line has every key, in this order:
- ts: arrival at the router (unix seconds); tenant, model: as asked; id: the request's id.
- version: the version that served it, or refused it once resolved (the hostd's `mmhost-served` trailer,
  ground/served.py), else the one asked for, else "".
- size_bytes: the version's stored size (its manifest's files) from the hostd; where no hostd resolved it
  (the router's own refusals) the size the cluster's heartbeats report for it; null when unknown.
- host: the host that answered (the last one tried), "" when none was.
- status: the gRPC status name; reason: the `mmhost-reason` of a refusal or failure, wherever it was
  refused (the router's own, or the hostd's trailer, passed on), "" for OK.
- load_ms, queue_ms, compute_ms: the hostd's waits for a model load, in the model's queue, and its batch's
  compute time; null where no hostd got that far. total_ms: the router's time for the request.
- bytes_in, bytes_out: request and response message bytes.

Off the request path: `write` appends a tuple to a bounded queue (the hostd's `mmhost-served` trailer as it
came, undecoded); a thread of its own decodes the trailers, turns the tuples into JSON and writes them in
batches (every FLUSH_S and on close). Past `max_pending` lines waiting (a stuck disk), new lines are dropped;
they and the lines of a failed write are counted (`on_drop`: mmhost_router_access_log_dropped_total). A file
rotates by size: past `max_bytes`, FILE becomes FILE.1 (FILE.1 becomes FILE.2 ..., `backups` kept); a rotation
that fails (FILE moved away or a rename refused) leaves FILE open for appending, and the writer thread goes on
(it reports a failure once on stderr until a write works again). '-' writes to stdout, where nothing else goes
(mmhost logs to stderr), so `kubectl logs` of a router with `--access-log -` is the trace. A router's Python-lane
workers (router/lane_workers.py) share that stdout, so on it a batch goes out in writes of whole lines, each at
most PIPE_BUF bytes (`whole_line_chunks`), which a pipe never interleaves with another process's: a batch of
lines written at once tore lines where two processes' batches met (tests/router/test_accesslog_shared_stdout.py).
"""

from __future__ import annotations

import json
import os
import select
import sys
import threading
from collections import deque
from collections.abc import Callable
from typing import TextIO

FIELDS = ("ts", "tenant", "model", "version", "size_bytes", "host", "status", "reason", "load_ms", "queue_ms",
          "compute_ms", "total_ms", "bytes_in", "bytes_out", "id")
FLUSH_S = 0.2
MAX_PENDING = 100_000


MAX_SIZES = 100_000  # stored sizes remembered (model versions served); past it the memory starts again


def _ms(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


def _served_ms(value: str) -> tuple[str, int, float, float, float] | None:
    """The `mmhost-served` trailer (ground/served.py: v=1;b=5300000;l=0.000;q=0.120;c=1.300) as (version,
    size_bytes, load_ms, queue_ms, compute_ms), its milliseconds as sent; None when malformed."""
    try:
        f = dict(part.split("=", 1) for part in value.split(";"))
        return f["v"], int(f["b"]), float(f["l"]), float(f["q"]), float(f["c"])
    except (KeyError, ValueError):
        return None


def encode(rec: tuple, sizes: dict | None = None) -> str:
    """One line (with its newline) from a tuple in FIELDS order, then the `mmhost-served` trailer (or None):
    where it is there and well formed, its version, size and times replace the tuple's (and the size is noted
    in `sizes`, by (tenant, model, version), when given)."""
    (ts, tenant, model, version, size, host, status, reason, load_ms, queue_ms, compute_ms, total_ms, b_in, b_out,
     rid, served) = rec
    if served and (decoded := _served_ms(served)) is not None:
        version, size, load_ms, queue_ms, compute_ms = decoded
        if sizes is not None:
            if len(sizes) >= MAX_SIZES:
                sizes.clear()
            sizes[(tenant, model, version)] = size
    # json.dumps escapes every non-ASCII character (ensure_ascii, its default): a line is ASCII, so its length
    # in characters is its length in bytes (flush counts the file's size with len(), without encoding).
    return json.dumps({"ts": round(ts, 6), "tenant": tenant, "model": model, "version": version, "size_bytes": size,
                       "host": host, "status": status, "reason": reason, "load_ms": _ms(load_ms),
                       "queue_ms": _ms(queue_ms), "compute_ms": _ms(compute_ms), "total_ms": round(total_ms, 3),
                       "bytes_in": b_in, "bytes_out": b_out, "id": rid}, separators=(",", ":")) + "\n"


def whole_line_chunks(lines: list[str], limit: int = select.PIPE_BUF) -> list[str]:
    """`lines` (each ending in a newline) joined into chunks of whole lines of at most `limit` bytes, in order; a
    line longer than `limit` is a chunk of its own. Lines are ASCII (see encode), so characters are bytes."""
    chunks: list[str] = []
    chunk: list[str] = []
    size = 0
    for line in lines:
        if chunk and size + len(line) > limit:
            chunks.append("".join(chunk))
            chunk, size = [], 0
        chunk.append(line)
        size += len(line)
    if chunk:
        chunks.append("".join(chunk))
    return chunks


def _write_all(fd: int, data: bytes) -> None:
    """All of `data` on `fd`: one write(2) when it fits PIPE_BUF (atomic on a pipe), more for a longer line."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class AccessLog:
    def __init__(self, out: TextIO | None, *, path: str | None = None, max_bytes: int = 0, backups: int = 0,
                 max_pending: int = MAX_PENDING, on_drop: Callable[[int], None] | None = None,
                 shared: bool = False) -> None:
        """`out`: where lines go (None: off); `path`: its file, for rotation past `max_bytes` (0: never);
        `shared`: other processes write to `out` too (stdout): whole lines, PIPE_BUF at a time."""
        self._out = out
        self._path = path
        # (tenant, model, version) -> stored size, from the hostds' mmhost-served trailers written so far: the size
        # of a fast-lane line, whose OK answers carry no trailer (router/fastlane.py)
        self.stored_sizes: dict[tuple[str, str, str], int] = {}
        self._max_bytes = max_bytes if path else 0
        self._backups = backups
        self._size = os.fstat(out.fileno()).st_size if path and out is not None else 0
        self._pending: deque[tuple] = deque()
        self._shared = shared
        self._max_pending = max_pending
        self._on_drop = on_drop
        self.dropped = 0
        self._lock = threading.Lock()  # one writer at a time: the thread, or flush()/close()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def open(cls, where: str | None, *, max_bytes: int = 0, backups: int = 0,
             on_drop: Callable[[int], None] | None = None) -> AccessLog:
        if not where:
            return cls(None)
        if where == "-":
            return cls(sys.stdout, on_drop=on_drop, shared=True)  # the Python-lane workers' stdout too
        return cls(open(where, "a", encoding="utf-8"), path=where, max_bytes=max_bytes,  # noqa: SIM115 - close()
                   backups=backups, on_drop=on_drop)

    @property
    def enabled(self) -> bool:
        return self._out is not None

    def write(self, *, ts: float, tenant: str, model: str, version: str, host: str, total_ms: float, status: str,
              bytes_in: int, bytes_out: int, id: str, size_bytes: int | None = None, reason: str = "",
              load_ms: float | None = None, queue_ms: float | None = None, compute_ms: float | None = None,
              served: str | None = None) -> None:
        """Queue one line (no encoding, no I/O here). `served`: the hostd's `mmhost-served` trailer, decoded in
        the writer thread; when well formed, its version, size and times are the line's (else the ones given)."""
        if self._out is None:
            return
        if len(self._pending) >= self._max_pending:
            self._count_dropped(1)
            return
        self._pending.append((ts, tenant, model, version, size_bytes, host, status, reason or "", load_ms, queue_ms,
                              compute_ms, total_ms, bytes_in, bytes_out, id, served))

    def _count_dropped(self, n: int) -> None:
        self.dropped += n
        if self._on_drop is not None:
            self._on_drop(n)

    def start(self) -> None:
        """Start the writer thread (lines written every FLUSH_S); without it, lines wait for flush()."""
        if self._out is None or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="access-log", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        failing = False
        while not self._stop.wait(FLUSH_S):
            try:
                self.flush()
                failing = False
            except Exception as e:  # a full or gone disk, a failed rotation, a closed stream: the thread goes on
                if not failing:  # say so once on stderr, keep serving (lines are lost until a write works)
                    print(f"access log: write or rotation failed (lines may be lost until it works again): {e!r}",
                          file=sys.stderr)
                failing = True

    def flush(self) -> None:
        """Write every queued line now (in the caller's thread)."""
        with self._lock:
            out = self._out
            if out is None:
                return
            pending = self._pending
            lines = []
            while pending:
                lines.append(encode(pending.popleft(), self.stored_sizes))
            if not lines:
                return
            # the lines joined once: into PIPE_BUF chunks on a shared stdout, else into one write
            chunks = whole_line_chunks(lines) if self._shared else ["".join(lines)]
            try:
                if out.closed and self._path is not None:  # a rotation could not reopen the file: again now
                    self._open("a")
                    out = self._out
                if self._shared:
                    out.flush()  # anything written through the stream first
                    fd = out.fileno()
                    for chunk in chunks:
                        _write_all(fd, chunk.encode("ascii"))
                else:
                    out.write(chunks[0])
                    out.flush()
            except (OSError, ValueError):  # ValueError: a closed stream
                self._count_dropped(len(lines))
                raise
            if self._max_bytes:
                self._size += len(chunks[0])  # a file: one chunk, ASCII (see encode): characters are bytes
                if self._size >= self._max_bytes:
                    self._rotate()

    def _open(self, mode: str) -> None:
        """(Re)open the file at `path`; what it holds already counts toward max_bytes."""
        assert self._path is not None
        out = open(self._path, mode, encoding="utf-8")  # noqa: SIM115 - closed in close() or the next rotation
        self._out = out
        self._size = os.fstat(out.fileno()).st_size

    def _rotate(self) -> None:
        """FILE becomes FILE.1 (...) and a new FILE is opened. Whatever fails, a file is open at FILE afterwards:
        the old one, appended to, when a rename failed (the error is raised, and the next flush tries again);
        a new one when FILE was moved away. When even the open fails, the next flush tries to open it."""
        assert self._path is not None and self._out is not None
        path = self._path
        rotated = False
        try:
            self._out.close()
            if self._backups > 0:
                for i in range(self._backups - 1, 0, -1):
                    if os.path.exists(f"{path}.{i}"):
                        os.replace(f"{path}.{i}", f"{path}.{i + 1}")
                if os.path.exists(path):  # else moved away already (by hand, or another rotator)
                    os.replace(path, f"{path}.1")
            rotated = True
        finally:
            self._open("w" if rotated else "a")

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None
        try:
            self.flush()
        finally:  # the file is closed even when the last lines could not be written
            with self._lock:
                if self._out is not None and self._out is not sys.stdout:
                    self._out.close()
                self._out = None
