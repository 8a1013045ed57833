"""Cost model: batch compute time (fixed + per item, per model) and load time (fixed + per byte, per tier).

Build it from measured numbers with `calibrate(data)`; `data` is a dict (or JSON file) in either form:
- direct:  {"load_fixed_s": 0.1, "load_s_per_byte": {"storage": 5e-9, "disk": 1e-9, "host_ram": 1e-10},
            "compute_default": {"fixed_s": 0.002, "per_item_s": 0.0004},
            "compute": {"tenant/model/1": {"fixed_s": ..., "per_item_s": ...}}}
- samples: {"loads": [{"tier": "storage", "bytes": 52000000, "seconds": 0.41}, ...],
            "batches": [{"model": "tenant/model/1", "size": 8, "seconds": 0.004}, ...]}
  fitted by least squares (seconds = fixed + slope * bytes or items), e.g. from Prometheus histograms.
  A load sample may stand for several loads: "count": n, with "bytes" and "seconds" their totals
  (seconds = n * fixed + slope * bytes), which is what the difference of two scrapes gives.
Both forms may be mixed; fitted samples override direct numbers.
"request_overhead_s" (direct only): time every served request spends outside queue, load and compute
(RPC hops, router, tensor conversion), added to each simulated latency; 0 by default.
"request_overhead_spread" (direct): the same as a distribution, [[seconds, cumulative probability], ...]: each
served request draws its own (on a busy host the time outside hostd has a long tail: on one kept run a median
of 2.5 ms and a p99 of 17 ms). It replaces request_overhead_s where given.
"request_overhead_spread_loaded" (direct): the spread of the requests that waited on a model load (the same run:
p99 21.8 ms, against 15.4 ms for those that did not); where given, a request that waited on a load draws from it
and the others from request_overhead_spread (then theirs alone). Without it every request draws from the one
spread, as configs written before it say. "request_overhead_by_wait" (direct): the same by how long the request
waited on its load, [[upper bound in seconds, or null for the last, spread], ...] in rising order: a request
that waited w draws from the first bin whose bound is at least w (a request that waits long on a load pays
more outside hostd too: on kept runs the two correlate, r 0.3-0.4); where given it replaces
request_overhead_spread_loaded.

A load has two stages, as in hostd (sim/loadpool.py): the first on a load worker (size x load_s_per_byte of
its tier, plus first_fixed_s: fetch and verify, or a copy from host RAM), the second under the loader's lock,
one load at a time per host (load_fixed_s + size x locked_s_per_byte: deserialize, warm-up, memory probes).
A load sample with "locked_seconds" and "first_seconds" (hostd's mmhost_model_load_path_seconds{stage="locked"}
and its fetch + verify phases) fits the two stages apart; one with "seconds" only fits their sum as before.
"unload_s" (direct): an unload's close, on the load pool; "fill_s_per_byte" (direct): a RAM-tier fill after a
load from disk or storage, on the load pool. Both 0 by default. "prepack_s_per_byte" (direct, 0 by default):
a reload's weights prepacked after it answered (hostd/loader.py), on a load worker under the loader's lock,
for a model this host loaded before. "locked_spread" (direct): how the locked stage
varies from load to load (on a shared CPU it does, a lot): [[multiplier, cumulative probability], ...], an
inverse CDF the full engine draws a multiplier from per load (mean 1; sim/calibrate.py builds it from hostd's
locked-stage histogram). Empty by default: every load takes its mean. "locked_corr" and "locked_window_s"
(direct): slow periods come in streaks (a shared CPU): each load uses its window's draw with probability
locked_corr instead of its own, so loads in the same window are correlated (the spread stays the same).
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

TIERS = ("storage", "disk", "host_ram")


@dataclass(frozen=True, slots=True)
class ComputeCost:
    fixed_s: float = 0.002
    per_item_s: float = 0.0005


@dataclass(frozen=True)
class CostModel:
    load_fixed_s: float = 0.1  # deserialize + warm-up, per load, any tier
    load_s_per_byte: Mapping[str, float] = field(
        default_factory=lambda: {"storage": 1 / 200e6, "disk": 1 / 1e9, "host_ram": 1 / 10e9}
    )
    compute_default: ComputeCost = ComputeCost()
    compute: Mapping[str, ComputeCost] = field(default_factory=dict)
    request_overhead_s: float = 0.0  # per served request, outside queue, load and compute
    first_fixed_s: float = 0.0  # per load, before the lock (a fetch's round trips)
    locked_s_per_byte: float = 0.0  # under the loader's lock, per byte (deserialize)
    unload_s: float = 0.0  # closing an evicted model, on the load pool
    fill_s_per_byte: float = 0.0  # copying a loaded model's file into the RAM tier, on the load pool
    prepack_s_per_byte: float = 0.0  # a reload's weights prepacked after it answered, under the loader's lock
    locked_spread: tuple[tuple[float, float], ...] = ()  # (multiplier, cumulative probability), mean 1
    locked_corr: float = 0.0  # chance that a load's draw is its window's (streaks of slow loads)
    locked_window_s: float = 1.0
    # (seconds, cumulative probability): how the time outside hostd varies per request; empty: request_overhead_s
    overhead_spread: tuple[tuple[float, float], ...] = ()
    # the same for the requests that waited on a model load; empty: they draw from overhead_spread too
    overhead_spread_loaded: tuple[tuple[float, float], ...] = ()
    # (load wait upper bound in seconds, spread) in rising order, the last bound inf: the loaded spread by wait
    overhead_by_wait: tuple[tuple[float, tuple[tuple[float, float], ...]], ...] = ()

    def overhead_seconds(self, u: float, loaded: bool = False, wait_s: float = 0.0) -> float:
        """One served request's time outside queue, load and compute, for a uniform draw `u` in [0, 1);
        `loaded`: the request waited on a model load, for `wait_s` seconds."""
        if loaded and self.overhead_by_wait:
            bounds, points = self._by_wait_points
            ps, xs = points[min(bisect.bisect_left(bounds, wait_s), len(points) - 1)]
        elif loaded and self.overhead_spread_loaded:
            ps, xs = self._overhead_loaded_points
        elif self.overhead_spread:
            ps, xs = self._overhead_points
        else:
            return self.request_overhead_s
        return float(np.interp(u, ps, xs))

    @property
    def overhead_varies(self) -> bool:
        """Requests draw their overhead (a spread is given), rather than all adding request_overhead_s."""
        return bool(self.overhead_spread or self.overhead_spread_loaded or self.overhead_by_wait)

    @cached_property
    def _overhead_points(self) -> tuple[np.ndarray, np.ndarray]:
        """The spread as np.interp's (p, x) arrays, built once: drawn for every simulated request."""
        return spread_points(self.overhead_spread)

    @cached_property
    def _overhead_loaded_points(self) -> tuple[np.ndarray, np.ndarray]:
        return spread_points(self.overhead_spread_loaded)

    @cached_property
    def _by_wait_points(self) -> tuple[list[float], list[tuple[np.ndarray, np.ndarray]]]:
        return [b for b, _ in self.overhead_by_wait], [spread_points(s) for _, s in self.overhead_by_wait]

    @cached_property
    def _locked_points(self) -> tuple[np.ndarray, np.ndarray]:
        return spread_points(self.locked_spread)

    def load_seconds(self, size: int, tier: str) -> float:
        return self.first_seconds(size, tier) + self.locked_seconds(size)

    def first_seconds(self, size: int, tier: str) -> float:
        """A load's stage on a worker before the loader's lock."""
        return self.first_fixed_s + size * self.load_s_per_byte[tier]

    def locked_seconds(self, size: int) -> float:
        """A load's stage under the loader's lock (one per host at a time), on average."""
        return self.load_fixed_s + size * self.locked_s_per_byte

    def locked_multiplier(self, u: float) -> float:
        """The locked stage of one load / its mean, for a uniform draw `u` in [0, 1) (1 without a spread)."""
        if not self.locked_spread:
            return 1.0
        ps, xs = self._locked_points
        return float(np.interp(u, ps, xs))

    def batch_seconds(self, model: str, items: int) -> float:
        c = self.compute.get(model, self.compute_default)
        return c.fixed_s + items * c.per_item_s


def spread_points(spread: Sequence[Sequence[float]]) -> tuple[np.ndarray, np.ndarray]:
    """An inverse CDF ((x, p), ...) as (p, x) arrays for np.interp: `np.interp(u, *spread_points(s))` is the
    value at cumulative probability u."""
    return np.array([p for _, p in spread], dtype=float), np.array([x for x, _ in spread], dtype=float)


def _fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """(intercept, slope) by least squares, both kept >= 0; one distinct x: the line through the origin."""
    x, y = np.asarray(xs, float), np.asarray(ys, float)
    if len(set(xs)) < 2:
        return 0.0, float(y.sum() / max(x.sum(), 1e-30))
    slope, intercept = np.polyfit(x, y, 1)
    if intercept < 0:
        return 0.0, float((x * y).sum() / (x * x).sum())
    if slope < 0:
        return float(y.mean()), 0.0
    return float(intercept), float(slope)


def _fit_counted(counts: list[float], xs: list[float], ys: list[float]) -> tuple[float, float]:
    """(fixed per load, slope) for totals over `counts` loads each: seconds = count * fixed + slope * bytes."""
    if all(c == 1 for c in counts):
        return _fit(xs, ys)
    c, x, y = (np.asarray(v, float) for v in (counts, xs, ys))
    if len(xs) >= 2 and np.linalg.matrix_rank(np.stack([c, x], 1)) == 2:
        (fixed, slope), *_ = np.linalg.lstsq(np.stack([c, x], 1), y, rcond=None)
        if fixed >= 0 and slope >= 0:
            return float(fixed), float(slope)
        if fixed < 0:
            return 0.0, float((x * y).sum() / max((x * x).sum(), 1e-30))
        return float((c * y).sum() / (c * c).sum()), 0.0
    return 0.0, float(y.sum() / max(x.sum(), 1e-30))


def calibrate(data: Mapping[str, Any] | str | Path) -> CostModel:
    if isinstance(data, (str, Path)):
        data = json.loads(Path(data).read_text())
    cm = CostModel()
    per_byte = dict(cm.load_s_per_byte)
    per_byte.update({k: float(v) for k, v in data.get("load_s_per_byte", {}).items()})
    fixed = float(data.get("load_fixed_s", cm.load_fixed_s))
    default = ComputeCost(**data["compute_default"]) if "compute_default" in data else cm.compute_default
    compute = {k: ComputeCost(**v) for k, v in data.get("compute", {}).items()}

    locked_per_byte = float(data.get("locked_s_per_byte", cm.locked_s_per_byte))
    first_fixed = float(data.get("first_fixed_s", cm.first_fixed_s))
    loads = data.get("loads", [])
    staged = [s for s in loads if "locked_seconds" in s and "first_seconds" in s]
    if staged:  # the two stages apart: the lock's share over all tiers, the first stage per tier
        fixed, locked_per_byte = _fit_counted([s.get("count", 1) for s in staged], [s["bytes"] for s in staged],
                                              [s["locked_seconds"] for s in staged])
        fixes = []
        for tier in sorted({s["tier"] for s in staged}):
            if tier not in TIERS:
                raise ValueError(f"unknown tier {tier!r}; known: {', '.join(TIERS)}")
            pts = [s for s in staged if s["tier"] == tier]
            f, per_byte[tier] = _fit_counted([s.get("count", 1) for s in pts], [s["bytes"] for s in pts],
                                             [s["first_seconds"] for s in pts])
            fixes.append(f)
        first_fixed = float(np.mean(fixes))
    elif loads:
        fixes = []
        for tier in {s["tier"] for s in loads}:
            if tier not in TIERS:
                raise ValueError(f"unknown tier {tier!r}; known: {', '.join(TIERS)}")
            pts = [s for s in loads if s["tier"] == tier]
            f, slope = _fit_counted([s.get("count", 1) for s in pts], [s["bytes"] for s in pts],
                                    [s["seconds"] for s in pts])
            per_byte[tier] = slope
            fixes.append(f)
        fixed = float(np.mean(fixes))
    by_model: dict[str, list[dict[str, Any]]] = {}
    for s in data.get("batches", []):
        by_model.setdefault(s["model"], []).append(s)
    for model, pts in by_model.items():
        f, slope = _fit([s["size"] for s in pts], [s["seconds"] for s in pts])
        compute[model] = ComputeCost(f, slope)
    overhead = float(data.get("request_overhead_s", cm.request_overhead_s))
    return replace(cm, load_fixed_s=fixed, load_s_per_byte=per_byte, compute_default=default, compute=compute,
                   request_overhead_s=overhead, first_fixed_s=first_fixed, locked_s_per_byte=locked_per_byte,
                   unload_s=float(data.get("unload_s", cm.unload_s)),
                   fill_s_per_byte=float(data.get("fill_s_per_byte", cm.fill_s_per_byte)),
                   prepack_s_per_byte=float(data.get("prepack_s_per_byte", cm.prepack_s_per_byte)),
                   locked_spread=_spread(data, "locked_spread"),
                   locked_corr=float(data.get("locked_corr", cm.locked_corr)),
                   locked_window_s=float(data.get("locked_window_s", cm.locked_window_s)),
                   overhead_spread=_spread(data, "request_overhead_spread"),
                   overhead_spread_loaded=_spread(data, "request_overhead_spread_loaded"),
                   overhead_by_wait=tuple((math.inf if b is None else float(b), _spread({"s": sp}, "s"))
                                          for b, sp in data.get("request_overhead_by_wait", ())))


def _spread(data: Mapping[str, Any], key: str) -> tuple[tuple[float, float], ...]:
    """An inverse CDF [[x, p], ...] of the direct form as a tuple of pairs (empty when absent)."""
    return tuple((float(x), float(p)) for x, p in data.get(key, ()))
