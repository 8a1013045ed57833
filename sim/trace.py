"""Recorded traces: the router's access log, JSON lines, one request per line.

Fields: ts (unix seconds, float), tenant, model, version; optional status, total_ms, queue_ms, host,
bytes_in, bytes_out, size_bytes (the model's measured size on the device). A model is "tenant/model/version";
its size is `sizes[key]` when given (e.g. hostd's measured memory per model), else the largest size_bytes
seen for it, else `default_size`. Lines are replayed in time order
(stable for equal times); blank lines are skipped; a malformed line is an error naming its number.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from sim.workload import ModelSpec, Workload

REQUIRED = ("ts", "tenant", "model", "version")


def read_trace(path: str | Path, default_size: int = 50_000_000, sizes: Mapping[str, int] | None = None) -> Workload:
    index: dict[str, int] = {}
    tenants: list[str] = []
    sizes_seen: list[int] = []
    ts: list[float] = []
    model: list[int] = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                missing = [k for k in REQUIRED if k not in rec]
                if missing:
                    raise ValueError(f"missing {', '.join(missing)}")
                key = f"{rec['tenant']}/{rec['model']}/{rec['version']}"
                t = float(rec["ts"])
                size = int(rec.get("size_bytes") or 0)
            except (ValueError, TypeError) as e:
                raise ValueError(f"{path}:{lineno}: bad trace line: {e}") from None
            i = index.get(key)
            if i is None:
                i = index[key] = len(sizes_seen)
                tenants.append(str(rec["tenant"]))
                sizes_seen.append(0)
            sizes_seen[i] = max(sizes_seen[i], size)
            ts.append(t)
            model.append(i)
    known = sizes or {}
    models = [ModelSpec(k, tenants[i], known.get(k) or sizes_seen[i] or default_size) for k, i in index.items()]
    t_arr = np.asarray(ts, dtype=np.float64)
    order = np.argsort(t_arr, kind="stable")
    return Workload(models, t_arr[order], np.asarray(model, dtype=np.int64)[order])


def trace_records(wl: Workload) -> Iterable[Mapping[str, Any]]:
    for t, i in zip(wl.ts.tolist(), wl.model.tolist(), strict=True):
        m = wl.models[i]
        tenant, model, version = m.key.split("/", 2)
        yield {"ts": t, "tenant": tenant, "model": model, "version": version, "size_bytes": m.size}


def write_trace(wl: Workload, path: str | Path) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for rec in trace_records(wl):
            f.write(json.dumps(rec) + "\n")
