"""The access log: one JSON line per inference request, which sim/trace.py replays as a trace.

    {"ts": 1717000000.123456, "tenant": "acme", "model": "mlp", "version": "1", "host": "10.0.0.5:8001",
     "total_ms": 1.92, "status": "OK", "bytes_in": 1324, "bytes_out": 108, "id": "req-7"}

ts is the arrival time (unix seconds); version is the one that served (from the response), else the one asked
for, else ""; host is the last host tried ("" when none was); queue_ms (hostd queue time) appears only when
known; reason (why the router refused it: quota_rate, quota_concurrency, deadline_infeasible, no_host,
deadline) appears only on the router's own refusals. Lines are buffered and flushed by the composition root's flush task and on close.
"""

from __future__ import annotations

import json
import sys
from typing import TextIO


class AccessLog:
    def __init__(self, out: TextIO | None) -> None:
        self._out = out

    @classmethod
    def open(cls, where: str | None) -> AccessLog:
        if not where:
            return cls(None)
        if where == "-":
            return cls(sys.stdout)
        return cls(open(where, "a", encoding="utf-8", buffering=1 << 16))  # noqa: SIM115 - closed in close()

    def write(self, *, ts: float, tenant: str, model: str, version: str, host: str, total_ms: float, status: str,
              bytes_in: int, bytes_out: int, id: str, queue_ms: float | None = None, reason: str | None = None) -> None:
        if self._out is None:
            return
        rec = {"ts": round(ts, 6), "tenant": tenant, "model": model, "version": version, "host": host,
               "total_ms": round(total_ms, 3), "status": status, "bytes_in": bytes_in, "bytes_out": bytes_out, "id": id}
        if queue_ms is not None:
            rec["queue_ms"] = round(queue_ms, 3)
        if reason:
            rec["reason"] = reason
        self._out.write(json.dumps(rec, separators=(",", ":")) + "\n")

    def flush(self) -> None:
        if self._out is not None:
            self._out.flush()

    def close(self) -> None:
        if self._out is not None:
            self._out.flush()
            if self._out is not sys.stdout:
                self._out.close()
            self._out = None
