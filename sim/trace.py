"""Recorded traces: the router's access log (router/accesslog.py), JSON lines, one request per line.

Fields read: ts (unix seconds), tenant, model, version, status, reason, size_bytes (the model version's
stored size, from the hostd that served it). A model is "tenant/model/version".

What is replayed, and what is not (counted in the TraceReport, which `mmhost sim` prints):
- a line that is not a JSON object (a log line mixed in by `kubectl logs`, a torn line): skipped, counted;
- a JSON object without ts, tenant, model and version (another program's JSON): skipped, counted;
- a line whose status is not OK: skipped, counted by status. NOT_FOUND and INVALID_ARGUMENT are not models
  anyone can load; a refusal (RESOURCE_EXHAUSTED, UNAVAILABLE, DEADLINE_EXCEEDED: the recorded system's
  shed) is counted as shed, by reason, so the replay's own shed can be set beside it. Lines with no status
  (synthetic traces, sim/trace.py's own writer) are replayed.

Model sizes: `sizes[key]` when given (`--sizes-from URI`: the store's manifests, sim/store_sizes.py), else the
largest size_bytes any line gave it, else `default_size`, and the report counts those models (a replay that
guessed sizes says so). Lines are replayed in time order (stable for equal times), several logs merged: a fleet
has one per router, and a router with Python-lane workers one per process (FILE, FILE.w1, ...).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sim.workload import ModelSpec, Workload

REQUIRED = ("ts", "tenant", "model", "version")
SHED_STATUSES = frozenset({"RESOURCE_EXHAUSTED", "UNAVAILABLE", "DEADLINE_EXCEEDED"})
DEFAULT_SIZE = 50_000_000


@dataclass
class TraceReport:
    """What reading a trace kept and skipped."""

    lines: int = 0  # non-blank lines read
    replayed: int = 0
    non_json: int = 0  # not a JSON object
    not_trace: int = 0  # JSON without the trace fields
    skipped_status: Counter = field(default_factory=Counter)  # non-OK lines by status
    shed_reasons: Counter = field(default_factory=Counter)  # the recorded shed, by mmhost-reason
    sized_default: list[str] = field(default_factory=list)  # models given default_size (no size known)
    default_size: int = DEFAULT_SIZE
    first_bad: int = 0  # line number of the first non-JSON line (0: none)
    first_bad_file: str = ""  # the file it is in, when several were read

    @property
    def shed(self) -> int:
        return sum(n for s, n in self.skipped_status.items() if s in SHED_STATUSES)

    @property
    def requested(self) -> int:
        """Requests the recorded system answered (replayed + non-OK)."""
        return self.replayed + sum(self.skipped_status.values())

    def summary(self) -> list[str]:
        """Lines for people: what was replayed, what was skipped and why, and any guessed sizes."""
        out = [f"replayed {self.replayed:,} of {self.lines:,} lines"]
        skipped = []
        if self.non_json:
            where = f"{self.first_bad_file} " if self.first_bad_file else ""
            skipped.append(f"{self.non_json:,} not JSON (first at {where}line {self.first_bad})")
        if self.not_trace:
            skipped.append(f"{self.not_trace:,} JSON without ts/tenant/model/version")
        for status, n in sorted(self.skipped_status.items(), key=lambda kv: -kv[1]):
            skipped.append(f"{n:,} {status}")
        if skipped:
            out.append("skipped: " + ", ".join(skipped))
        if self.shed:
            why = ", ".join(f"{r} {n:,}" for r, n in self.shed_reasons.most_common())
            out.append(f"the recorded system shed {self.shed:,} of {self.requested:,} requests "
                       f"({self.shed / max(self.requested, 1):.1%}: {why}); they are not replayed")
        if self.sized_default:
            names = ", ".join(self.sized_default[:5]) + (" ..." if len(self.sized_default) > 5 else "")
            out.append(f"WARNING: {len(self.sized_default)} model(s) had no size in the trace and were given "
                       f"{self.default_size / 1e6:g} MB: {names} (use --sizes-from STORE)")
        return out


def read_trace_report(path: str | Path | Sequence[str | Path], default_size: int = DEFAULT_SIZE,
                      sizes: Mapping[str, int] | None = None,
                      sizes_for: Callable[[list[str]], Mapping[str, int]] | None = None
                      ) -> tuple[Workload, TraceReport]:
    """The workload and what was skipped. `path`: one access log or several (a fleet's routers, a router's
    Python-lane workers' FILE.wN), merged in time order. `sizes`: known sizes by key; `sizes_for(keys)`:
    called once with the replayed models' keys for sizes that win over the trace's (the store's,
    sim/store_sizes.py)."""
    paths = [path] if isinstance(path, (str, Path)) else list(path)
    rep = TraceReport(default_size=default_size)
    index: dict[str, int] = {}
    tenants: list[str] = []
    sizes_seen: dict[str, int] = {}
    ts: list[float] = []
    model: list[int] = []
    named = len(paths) > 1  # a bad line says which file it is in
    for path_of, lineno, line in _numbered_lines(paths):
        if not line.strip():
            continue
        rep.lines += 1
        try:
            rec = json.loads(line)
        except ValueError:
            rec = None
        if not isinstance(rec, dict):
            rep.non_json += 1
            if not rep.first_bad:
                rep.first_bad, rep.first_bad_file = lineno, str(path_of) if named else ""
            continue
        try:
            key = f"{rec['tenant']}/{rec['model']}/{rec['version']}"
            t = float(rec["ts"])
            size = int(rec.get("size_bytes") or 0)
        except (KeyError, ValueError, TypeError):
            rep.not_trace += 1
            continue
        if size > sizes_seen.get(key, 0):
            sizes_seen[key] = size
        status = rec.get("status", "OK")
        if status != "OK":
            rep.skipped_status[str(status)] += 1
            if status in SHED_STATUSES:
                rep.shed_reasons[str(rec.get("reason") or status.lower())] += 1
            continue
        if not rec["model"]:
            rep.not_trace += 1
            continue
        i = index.get(key)
        if i is None:
            i = index[key] = len(tenants)
            tenants.append(str(rec["tenant"]))
        ts.append(t)
        model.append(i)
    rep.replayed = len(ts)
    if not ts:
        raise ValueError(f"{', '.join(map(str, paths))}: no request to replay ({'; '.join(rep.summary())})")
    known = dict(sizes or {})
    if sizes_for is not None:
        known.update(sizes_for(list(index)))
    models = []
    for k, i in index.items():
        size = known.get(k) or sizes_seen.get(k, 0)
        if not size:
            rep.sized_default.append(k)
            size = default_size
        models.append(ModelSpec(k, tenants[i], size))
    t_arr = np.asarray(ts, dtype=np.float64)
    order = np.argsort(t_arr, kind="stable")
    return Workload(models, t_arr[order], np.asarray(model, dtype=np.int64)[order]), rep


def _numbered_lines(paths: Sequence[str | Path]) -> Iterable[tuple[str | Path, int, str]]:
    """(file, line number, line) of every line of the files, one file after another."""
    for path in paths:
        with open(path, encoding="utf-8", errors="replace") as f:
            for lineno, line in enumerate(f, 1):
                yield path, lineno, line


def read_trace(path: str | Path | Sequence[str | Path], default_size: int = DEFAULT_SIZE,
               sizes: Mapping[str, int] | None = None) -> Workload:
    return read_trace_report(path, default_size, sizes)[0]


def trace_records(wl: Workload) -> Iterable[Mapping[str, Any]]:
    for t, i in zip(wl.ts.tolist(), wl.model.tolist(), strict=True):
        m = wl.models[i]
        tenant, model, version = m.key.split("/", 2)
        yield {"ts": t, "tenant": tenant, "model": model, "version": version, "size_bytes": m.size}


def write_trace(wl: Workload, path: str | Path) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for rec in trace_records(wl):
            f.write(json.dumps(rec) + "\n")


def access_records(path: str | Path) -> list[dict[str, Any]]:
    """The JSON objects of an access log, in order; other lines (logs mixed in, partial lines) are skipped."""
    out = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                rec = json.loads(line) if line.strip() else None
            except ValueError:
                continue
            if isinstance(rec, dict):
                out.append(rec)
    return out
