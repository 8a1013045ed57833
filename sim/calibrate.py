"""A running cluster's Prometheus pages -> a simulator config (`mmhost sim calibrate --from-metrics URL...`).

Input: for each hostd, its pages scraped one or more times (sim/fidelity.py parses them), and optionally the
routers' pages. Output: a dict that `SimConfig` (sim/config.py) accepts, so `mmhost sim run --config FILE`
and `--trace` replays run on the measured cluster:

- hosts, device budget (cache_bytes), watermarks, host RAM tier, execution slots, load workers: the hostds'
  own gauges (mmhost_cache_budget_bytes, mmhost_cache_watermark_bytes, mmhost_execution_slots,
  mmhost_load_workers); full mode, the router's 3 attempts per request.
- costs (sim/costs.py, direct form plus batch samples): the locked stage of a load (deserialize, warm-up and
  probes under the loader's lock: mmhost_model_load_path_seconds{stage="locked"}) fitted as fixed + per byte
  over load samples; the first stage (fetch + verify phases) per byte of the loads that did not come from host
  RAM; compute per batch per model from the compute-time and batch-size histograms; the per-request overhead
  outside hostd (router and RPC hop) = the routers' median forward time - the hostds' median request time
  (from their histograms' buckets; the means when there are no buckets: a mean is dragged up by the requests
  that waited on loads or were retried, a median is what a served-from-cache request pays) and how it varies
  from request to request (from a router's access log when given: one spread for the requests that waited on
  a model load, by how long they waited, one for the others; else one spread from the histograms); an
  unload's close = the evict stage per capacity eviction less a mean pool wait; how the locked stage varies
  from load to load (locked_spread) from its histogram's buckets; how a model's measured size varies from load
  to load (size_spread) from the distinct readings of mmhost_model_memory_bytes; whether slow loads come in
  streaks (locked_corr over a window of one scrape interval) from the per-interval means, when the scrapes
  carry their time (HostdScrape.at).
- Load samples: with two or more scrapes of a host, one per interval in which loads finished (count, bytes,
  seconds; the bytes from each model's measured memory); with one scrape, the host's totals as one sample.

Pure: takes parsed scrapes, returns data. Fetching the pages is the CLI's (mmhost/cli_sim_calibrate.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from sim.costs import _fit_counted
from sim.fidelity import HostdScrape, batch_samples, loads_between, measured_sizes

ROUTER_ATTEMPTS = 3  # the router's default max_attempts (ground/settings.py RouterSettings)
LOAD_WORKERS = 4  # hostd's load threads, when a hostd does not export mmhost_load_workers


@dataclass
class RouterScrape:
    forward_s: float = 0.0  # mmhost_router_forward_seconds sum
    forwards: float = 0.0  # ... count
    buckets: dict[float, float] = field(default_factory=dict)  # ... le -> cumulative count


def is_router(text: str) -> bool:
    return "mmhost_router_forward_seconds" in text


def parse_router_metrics(text: str) -> RouterScrape:
    r = RouterScrape()
    for fam in text_string_to_metric_families(text):
        for x in fam.samples:
            if x.name == "mmhost_router_forward_seconds_sum":
                r.forward_s += x.value
            elif x.name == "mmhost_router_forward_seconds_count":
                r.forwards += x.value
            elif x.name == "mmhost_router_forward_seconds_bucket":
                le = float(x.labels["le"])
                r.buckets[le] = r.buckets.get(le, 0.0) + x.value
    return r


def _size_of(sizes: Mapping[str, int], fallback: float) -> dict[str, float]:
    """'tenant/model' -> bytes (the largest version seen), from 'tenant/model/version' sizes."""
    out: dict[str, float] = {}
    for k, v in sizes.items():
        tm = k.rsplit("/", 1)[0]
        out[tm] = max(out.get(tm, 0.0), float(v))
    out.setdefault("", fallback)
    return out


def load_samples(series: Sequence[HostdScrape], size_of: Mapping[str, float]) -> list[dict[str, float]]:
    """One host's scrapes -> load samples {count, bytes, locked_seconds, first_seconds, ram}: per interval with
    loads (two or more scrapes), else the totals of its one scrape."""
    if not series:
        return []
    pairs = list(zip(series, series[1:], strict=False)) or [(HostdScrape(), series[-1])]
    out = []
    for prev, cur in pairs:
        count, nbytes = loads_between(prev, cur, lambda key: size_of.get(key, size_of[""]))
        if count <= 0:
            continue
        first = sum(cur.phases.get(p, 0.0) - prev.phases.get(p, 0.0) for p in ("fetch", "verify"))
        out.append({"count": count, "bytes": nbytes, "first_seconds": first,
                    "locked_seconds": cur.path.get("locked", 0.0) - prev.path.get("locked", 0.0),
                    "ram": cur.tiers.get("host_ram", 0.0) - prev.tiers.get("host_ram", 0.0)})
    return out


def delta(series: Sequence[Any], attr: str, key: str | None = None) -> float:
    """How much a counter grew over one process's scrapes (its last value when there is one scrape): the
    attribute `attr`, or with `key` that entry of the dict attribute `attr` (0 when absent)."""
    def value(s: Any) -> float:
        v = getattr(s, attr)
        return v if key is None else v.get(key, 0.0)

    return float(value(series[-1]) - (value(series[0]) if len(series) > 1 else 0.0))


def quantile_from_buckets(buckets: Mapping[float, float], q: float) -> float:
    """The q-quantile of a cumulative histogram (upper bound -> count), linear within its bucket; nan when
    empty; the last finite bound when it falls in the +Inf bucket."""
    finite = sorted(b for b in buckets if math.isfinite(b))
    total = max(buckets.values(), default=0.0)
    if total <= 0 or not finite:
        return float("nan")
    target, lo, c_lo = q * total, 0.0, 0.0
    for le in finite:
        c = buckets[le]
        if c >= target:
            return lo + (le - lo) * ((target - c_lo) / (c - c_lo) if c > c_lo else 1.0)
        lo, c_lo = le, c
    return finite[-1]


def _bucket_delta(series: Sequence[Any], attr: str) -> dict[float, float]:
    last, first = getattr(series[-1], attr), (getattr(series[0], attr) if len(series) > 1 else {})
    return {le: c - first.get(le, 0.0) for le, c in last.items()}


def pooled(series: Sequence[Sequence[Any]], attr: str = "buckets") -> dict[float, float]:
    """A histogram (le -> cumulative count; `attr`, by default the request-time one) of several processes
    over their scrapes, added up."""
    out: dict[float, float] = {}
    for one in series:
        for le, c in _bucket_delta(one, attr).items():
            out[le] = out.get(le, 0.0) + c
    return out


def overhead_s(hosts: Sequence[Sequence[HostdScrape]], routers: Sequence[Sequence[RouterScrape]]) -> float:
    """Seconds per request outside hostd: the routers' median forward time minus the hostds' median request
    time (the means when the pages carry no buckets)."""
    if not routers or not hosts:
        return 0.0
    rb, hb = pooled(routers), pooled(hosts)
    if max(rb.values(), default=0.0) > 0 and max(hb.values(), default=0.0) > 0:
        return max(0.0, quantile_from_buckets(rb, 0.5) - quantile_from_buckets(hb, 0.5))
    fs, fn = sum(delta(r, "forward_s") for r in routers), sum(delta(r, "forwards") for r in routers)
    hs, hn = sum(delta(h, "request_s") for h in hosts), sum(delta(h, "requests") for h in hosts)
    if fn <= 0 or hn <= 0:
        return 0.0
    return max(0.0, fs / fn - hs / hn)


# The points of an overhead spread (inverse CDF): every 2.5% up to p95, then dense in the tail that the sim's
# p99 draws from. With even points only (p97.5, then p100) every draw above p97.5 fell on a line to the one
# slowest request: on kept runs the spread said 22-69 ms at p99 where the requests' own p99 was 16-31 ms.
OVERHEAD_QUANTILES = np.round(np.concatenate([np.linspace(0.0, 0.95, 39), [0.96, 0.97, 0.98, 0.99, 0.995, 0.999, 1.0]]), 6)


def _monotone_spread(values: Sequence[float]) -> list[list[float]]:
    """Values at OVERHEAD_QUANTILES as an inverse CDF [[seconds, p], ...], clipped at 0 and non-decreasing."""
    out, top = [], 0.0
    for v, p in zip(values, OVERHEAD_QUANTILES, strict=True):
        top = max(top, float(v), 0.0)
        out.append([top, float(p)])
    return out


def overhead_spread(hosts: Sequence[Sequence[HostdScrape]], routers: Sequence[Sequence[RouterScrape]]) -> list[list[float]]:
    """How the time outside hostd varies from request to request, from metrics alone: at each quantile q, the
    routers' forward-time quantile minus the hostds' request-time quantile. Exact when the two rise together;
    they do not quite (on one kept Zipf run's access log, this difference gave 10.7 ms at p99 where the
    requests' own overheads had 17.0 ms, and the median alone 2.6 ms). Empty without both histograms."""
    rb, hb = pooled(routers), pooled(hosts)
    if max(rb.values(), default=0.0) <= 0 or max(hb.values(), default=0.0) <= 0:
        return []
    return _monotone_spread([quantile_from_buckets(rb, min(q, 0.999)) - quantile_from_buckets(hb, min(q, 0.999))
                             for q in OVERHEAD_QUANTILES])


LOAD_WAIT_MS = 0.1  # a served request whose load_ms is over this waited on a load (a ready model: microseconds)
MIN_LOADED_REQUESTS = 20  # fewer requests that waited on a load than this: one spread for every request


WAIT_BINS = 3  # request_overhead_by_wait: bins of equal counts of the load wait, each with MIN_LOADED_REQUESTS or more


def request_overheads(records: Iterable[Mapping[str, Any]]) -> tuple[list[float], list[float], list[float]]:
    """Per served request of a router's access log, its time outside hostd in seconds: its total time at the
    router minus what hostd accounts for it (load wait, queue, compute); (those of the requests that did not
    wait on a model load, those of the requests that did, and the latter's load waits in seconds)."""
    ready: list[float] = []
    waited: list[float] = []
    waits: list[float] = []
    for r in records:
        if r.get("status") != "OK" or r.get("total_ms") is None:
            continue
        load = float(r.get("load_ms") or 0)
        ov = max(0.0, float(r["total_ms"]) - load - float(r.get("queue_ms") or 0) - float(r.get("compute_ms") or 0))
        if load > LOAD_WAIT_MS:
            waited.append(ov / 1e3)
            waits.append(load / 1e3)
        else:
            ready.append(ov / 1e3)
    return ready, waited, waits


def _spread_of(values: Sequence[float]) -> list[list[float]]:
    return _monotone_spread(np.quantile(np.asarray(values), OVERHEAD_QUANTILES).tolist()) if values else []


def overhead_spread_from_log(records: Iterable[Mapping[str, Any]]) -> list[list[float]]:
    """The same from a router's access log, exactly: every served request's own time outside hostd
    (request_overheads). Empty with no served requests."""
    ready, waited, _ = request_overheads(records)
    return _spread_of(ready + waited)


def by_wait(waited: Sequence[float], waits: Sequence[float], bins: int = WAIT_BINS) -> list[list[Any]]:
    """The overheads of the requests that waited on a load, by their load wait: `bins` bins of (about) equal
    counts, [[upper bound of the wait in seconds, spread], ..., [None, spread]] (None: no bound)."""
    order = np.argsort(np.asarray(waits), kind="stable")
    parts = np.array_split(order, bins)
    out: list[list[Any]] = []
    for i, part in enumerate(parts):
        bound = None if i == len(parts) - 1 else float(waits[part[-1]])
        out.append([bound, _spread_of([waited[j] for j in part])])
    return out


def overhead_spreads_from_log(records: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The cost model's overhead spreads from an access log: request_overhead_spread of the requests that did
    not wait on a model load and request_overhead_spread_loaded of those that did (the second pay more
    outside hostd too: on one kept Zipf run p50/p99 2.3/16.0 ms against 2.9/22.6 ms), and with
    WAIT_BINS x MIN_LOADED_REQUESTS of those or more, request_overhead_by_wait: theirs by how long they waited
    (the longer the wait, the more they pay outside hostd: on six kept runs the two correlate, r 0.29-0.38);
    with fewer than MIN_LOADED_REQUESTS that waited, or none that did not, one spread of all."""
    ready, waited, waits = request_overheads(records)
    if len(waited) >= MIN_LOADED_REQUESTS and ready:
        out: dict[str, Any] = {"request_overhead_spread": _spread_of(ready),
                               "request_overhead_spread_loaded": _spread_of(waited)}
        if len(waited) >= WAIT_BINS * MIN_LOADED_REQUESTS:
            out["request_overhead_by_wait"] = by_wait(waited, waits)
        return out
    both = _spread_of(ready + waited)
    return {"request_overhead_spread": both} if both else {}


MIN_SPREAD_LOADS = 20  # fewer loads than this: no spread (every load takes its mean)


def size_spread(series: Sequence[Sequence[HostdScrape]]) -> list[list[float]]:
    """How measured sizes vary from load to load: every distinct reading of a model's memory gauge (one per
    load, as a rule) over that model's median reading, pooled, as an inverse CDF [[ratio, p], ...]; empty
    with fewer than MIN_SPREAD_LOADS readings."""
    readings: dict[tuple[int, str], set[int]] = {}
    for i, host in enumerate(series):
        for s in host:
            for k, v in s.memory.items():
                readings.setdefault((i, k), set()).add(v)
    by_model: dict[str, list[int]] = {}
    for (_, k), vs in readings.items():
        by_model.setdefault(k, []).extend(vs)
    ratios = sorted(v / float(np.median(vs)) for vs in by_model.values() for v in vs)
    if len(ratios) < MIN_SPREAD_LOADS:
        return []
    n = len(ratios)
    return [[r, i / (n - 1)] for i, r in enumerate(ratios)]


def spread_from_buckets(buckets: Mapping[float, float]) -> list[list[float]]:
    """A cumulative histogram (upper bound -> count) as an inverse CDF [[multiplier, p], ...] of value / mean:
    uniform within each bucket (the +Inf bucket: up to twice the last bound). Empty without observations."""
    finite = sorted(b for b in buckets if math.isfinite(b))
    total = max(buckets.values(), default=0.0)
    if total <= 0 or not finite:
        return []
    edges = [(0.0, 0.0)] + [(le, buckets[le]) for le in finite]
    if total > edges[-1][1]:
        edges.append((2 * finite[-1], total))
    pts: list[tuple[float, float]] = []
    mean = 0.0
    for (lo, c0), (hi, c1) in zip(edges, edges[1:], strict=False):
        if c1 <= c0:
            continue
        if not pts or pts[-1][0] != lo:
            pts.append((lo, c0 / total))
        pts.append((hi, c1 / total))
        mean += (c1 - c0) / total * (lo + hi) / 2
    return [[x / mean, p] for x, p in pts] if mean > 0 else []


def spread_variance(spread: Sequence[Sequence[float]]) -> float:
    """Variance of the multiplier an inverse CDF [[x, p], ...] describes (uniform between its points)."""
    m1 = m2 = 0.0
    for (a, p0), (b, p1) in zip(spread, spread[1:], strict=False):
        w = p1 - p0
        m1 += w * (a + b) / 2
        m2 += w * (a * a + a * b + b * b) / 3
    return max(0.0, m2 - m1 * m1)


def streak_correlation(series: Sequence[Sequence[HostdScrape]], variance: float) -> float:
    """How much the locked stage's slow loads come together: the chance rho that a load shares its scrape
    interval's draw, from how far each interval's mean locked time strays from the overall mean beyond what
    independent loads would give: E[(m_i - mu)^2] = s^2 (1/n_i + (1 - 1/n_i) rho^2), s^2 the per-load variance
    (`variance` x mu^2). Intervals with fewer than 2 loads say nothing about it."""
    pts = []
    for h in series:
        for prev, cur in zip(h, h[1:], strict=False):
            n = cur.path.get("locked_count", 0.0) - prev.path.get("locked_count", 0.0)
            if n >= 1:
                pts.append((n, cur.path.get("locked", 0.0) - prev.path.get("locked", 0.0)))
    total_n = sum(n for n, _ in pts)
    if total_n <= 0 or variance <= 0:
        return 0.0
    mu = sum(x for _, x in pts) / total_n
    s2 = variance * mu * mu
    multi = [(n, x / n) for n, x in pts if n >= 2]
    if not multi or s2 <= 0:
        return 0.0
    excess = float(np.mean([(m - mu) ** 2 - s2 / n for n, m in multi]))
    share = float(np.mean([1 - 1 / n for n, _ in multi]))
    return float(min(1.0, max(0.0, excess / (s2 * share)) ** 0.5))


def calibrate_cluster(hosts: Sequence[Sequence[HostdScrape]], routers: Sequence[Sequence[RouterScrape]] = (),
                      sizes: Mapping[str, int] | None = None,
                      access_log: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """A SimConfig dict from each hostd's scrapes (and the routers'). `sizes`: measured bytes per
    'tenant/model/version' (default: hostd's mmhost_model_memory_bytes seen in the scrapes). `access_log`:
    a router's access-log records over the same time, for the exact spreads of the time outside hostd, one
    for the requests that waited on a load and one for the others (else one spread estimated from the
    histograms)."""
    hosts = [h for h in hosts if h]
    if not hosts:
        raise ValueError("no hostd metrics to calibrate from")
    sizes = dict(sizes) if sizes is not None else measured_sizes(s for h in hosts for s in h)
    fallback = float(np.median(list(sizes.values()))) if sizes else 50e6
    size_of = _size_of(sizes, fallback)
    samples = [smp for h in hosts for smp in load_samples(h, size_of)]
    costs: dict[str, Any] = {}
    locked = [s for s in samples if s["locked_seconds"] > 0]
    if locked:
        fixed, per_byte = _fit_counted([s["count"] for s in locked], [s["bytes"] for s in locked],
                                       [s["locked_seconds"] for s in locked])
        costs.update(load_fixed_s=fixed, locked_s_per_byte=per_byte, first_fixed_s=0.0)
    prepacks = sum(delta(h, "phase_counts", "prepack") for h in hosts)
    if prepacks > 0 and samples:  # reloads prepacked after READY: seconds per byte of a mean load
        mean_bytes = sum(s["bytes"] for s in samples) / max(sum(s["count"] for s in samples), 1.0)
        costs["prepack_s_per_byte"] = sum(delta(h, "phases", "prepack") for h in hosts) / prepacks / max(mean_bytes, 1.0)
    not_ram = sum(s["count"] - s["ram"] for s in samples)
    per_byte_tier: dict[str, float] = {"host_ram": 0.0} if samples else {}
    if not_ram > 0:
        nbytes = sum(s["bytes"] * (s["count"] - s["ram"]) / s["count"] for s in samples)
        first = sum(s["first_seconds"] for s in samples)
        per_byte_tier.update(storage=first / max(nbytes, 1.0), disk=first / max(nbytes, 1.0))
    if per_byte_tier:
        costs["load_s_per_byte"] = per_byte_tier
    evictions = sum(delta(h, "evictions") for h in hosts)
    pool_waits = sum(delta(h, "path", "pool_wait_count") for h in hosts)
    if evictions > 0 and pool_waits > 0:
        evict_s = sum(delta(h, "path", "evict") for h in hosts)
        pool_s = sum(delta(h, "path", "pool_wait") for h in hosts)
        costs["unload_s"] = max(0.0, evict_s / evictions - pool_s / pool_waits)
    buckets = pooled(hosts, "locked_buckets")
    if max(buckets.values(), default=0.0) >= MIN_SPREAD_LOADS:
        costs["locked_spread"] = spread_from_buckets(buckets)
        windows = [b.at - a.at for h in hosts for a, b in zip(h, h[1:], strict=False) if b.at > a.at]
        rho = streak_correlation(hosts, spread_variance(costs["locked_spread"])) if windows else 0.0
        if rho > 0:
            costs.update(locked_corr=round(rho, 4), locked_window_s=float(np.median(windows)))
    spread = size_spread(hosts)
    batches = batch_samples([h[-1] for h in hosts])
    if batches:
        costs["batches"] = batches
    costs["request_overhead_s"] = overhead_s(hosts, routers)
    if access_log:
        costs.update(overhead_spreads_from_log(access_log))
    elif ov := overhead_spread(hosts, routers):
        costs["request_overhead_spread"] = ov
    last = [h[-1] for h in hosts]
    budget = int(np.median([s.budget for s in last]))
    cfg: dict[str, Any] = {"mode": "full", "policies": ["lru"], "hosts": len(hosts), "attempts": ROUTER_ATTEMPTS,
                           "load_workers": int(max(s.load_workers for s in last)) or LOAD_WORKERS, "costs": costs}
    if budget > 0:
        cfg["cache_bytes"] = budget
        high = float(np.median([s.high for s in last])) / budget
        low = float(np.median([s.low for s in last])) / budget
        if 0 < low <= high <= 1:
            cfg.update(high=round(high, 4), low=round(low, 4))
    cfg["host_ram_bytes"] = int(np.median([s.ram_budget for s in last]))
    if spread:
        cfg["size_spread"] = spread
    slots = int(max(s.slots for s in last))
    if slots:
        cfg["slots"] = slots
    return cfg
