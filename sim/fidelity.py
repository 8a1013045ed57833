"""From the real system's own metrics to sim.costs.calibrate's input: the fidelity check's glue.

A hostd's Prometheus page is parsed into a `HostdScrape` (cumulative counters). The difference of two
scrapes of one host is one load sample: the loads that finished between them (count), their bytes (sizes
passed in: hostd's measured memory per model), their seconds (sum of all load phases), and the tier they came
from (host RAM, disk or storage, from the cache hit/miss counters; an interval whose loads came from more
than one tier gives no sample). Batch samples come from the compute-time and batch-size histograms, one per
model, summed over hosts. Model keys are "tenant/model/version", as in traces.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from prometheus_client.parser import text_string_to_metric_families


@dataclass
class HostdScrape:
    load_seconds: float = 0.0  # all phases of all loads on their way to READY (not the prepack after it)
    loads: dict[str, float] = field(default_factory=dict)  # "tenant/model" -> successful loads
    tiers: dict[str, float] = field(default_factory=dict)  # "host_ram" / "disk" / "storage" -> loads from there
    compute: dict[str, list[float]] = field(default_factory=dict)  # "tenant/model" -> [seconds, batches]
    rows: dict[str, list[float]] = field(default_factory=dict)  # "tenant/model" -> [rows, batches]
    memory: dict[str, int] = field(default_factory=dict)  # "tenant/model/version" -> measured bytes (resident)
    phases: dict[str, float] = field(default_factory=dict)  # load phase -> seconds (fetch, verify, deserialize, ...)
    phase_counts: dict[str, float] = field(default_factory=dict)  # load phase -> how many times it ran
    path: dict[str, float] = field(default_factory=dict)  # load-path stage -> seconds (evict, pool_wait, lock_wait, ...)
    requests: float = 0.0  # answered by this hostd (request-duration count)
    request_s: float = 0.0  # their arrival-to-answer seconds
    queue_s: float = 0.0  # their seconds in a model queue
    shed: float = 0.0  # refused before reaching a model
    budget: float = 0.0  # device budget, bytes
    ram_budget: float = 0.0
    high: float = 0.0  # watermarks, bytes
    low: float = 0.0
    slots: float = 0.0  # execution slots (0: not exported)
    load_workers: float = 0.0
    evictions: float = 0.0  # device evictions to make room for a load (reason capacity)
    watermark_evictions: float = 0.0  # device evictions after a load measured more than it reserved
    locked_buckets: dict[float, float] = field(default_factory=dict)  # le -> cumulative count, locked stage
    total_buckets: dict[float, float] = field(default_factory=dict)  # le -> cumulative count, load start to READY
    buckets: dict[float, float] = field(default_factory=dict)  # request duration: le -> cumulative count, all models
    at: float = 0.0  # when it was scraped (seconds, any clock; set by the scraper, 0 when unknown)


def parse_hostd_metrics(text: str) -> HostdScrape:
    s = HostdScrape()
    for fam in text_string_to_metric_families(text):
        for x in fam.samples:
            lb, v = x.labels, x.value
            if x.name == "mmhost_model_load_duration_seconds_sum":
                if lb["phase"] != "prepack":  # after READY, in the background: no load waits for it
                    s.load_seconds += v
                s.phases[lb["phase"]] = s.phases.get(lb["phase"], 0.0) + v
            elif x.name == "mmhost_model_load_duration_seconds_count":
                s.phase_counts[lb["phase"]] = s.phase_counts.get(lb["phase"], 0.0) + v
            elif x.name == "mmhost_model_load_path_seconds_sum":
                s.path[lb["stage"]] = v
            elif x.name == "mmhost_model_load_path_seconds_count":
                s.path[lb["stage"] + "_count"] = v
            elif x.name == "mmhost_model_load_path_seconds_bucket" and lb.get("stage") == "locked":
                s.locked_buckets[float(lb["le"])] = v
            elif x.name == "mmhost_model_load_path_seconds_bucket" and lb.get("stage") == "total":
                s.total_buckets[float(lb["le"])] = v
            elif x.name == "mmhost_cache_evictions_total" and lb.get("tier") == "device":
                if lb.get("reason") == "capacity":
                    s.evictions += v
                elif lb.get("reason") == "watermark":
                    s.watermark_evictions += v
            elif x.name == "mmhost_request_duration_seconds_sum":
                s.request_s += v
            elif x.name == "mmhost_request_duration_seconds_count":
                s.requests += v
            elif x.name == "mmhost_request_duration_seconds_bucket":
                le = float(lb["le"])
                s.buckets[le] = s.buckets.get(le, 0.0) + v
            elif x.name == "mmhost_queue_duration_seconds_sum":
                s.queue_s += v
            elif x.name == "mmhost_requests_shed_total":
                s.shed += v
            elif x.name == "mmhost_cache_budget_bytes" and lb.get("tier") in ("device", "ram"):
                if lb["tier"] == "device":
                    s.budget = v
                else:
                    s.ram_budget = v
            elif x.name == "mmhost_cache_watermark_bytes" and lb.get("level") in ("high", "low"):
                setattr(s, lb["level"], v)
            elif x.name == "mmhost_execution_slots":
                s.slots = v
            elif x.name == "mmhost_load_workers":
                s.load_workers = v
            elif x.name == "mmhost_model_loads_total" and lb.get("result") == "success":
                s.loads[f"{lb['tenant']}/{lb['model']}"] = v
            elif x.name == "mmhost_cache_hits_total" and lb.get("tier") == "ram":
                s.tiers["host_ram"] = s.tiers.get("host_ram", 0.0) + v
            elif x.name == "mmhost_cache_hits_total" and lb.get("tier") == "disk":
                s.tiers["disk"] = s.tiers.get("disk", 0.0) + v
            elif x.name == "mmhost_cache_misses_total" and lb.get("tier") == "disk":
                s.tiers["storage"] = s.tiers.get("storage", 0.0) + v
            elif x.name in ("mmhost_compute_duration_seconds_sum", "mmhost_compute_duration_seconds_count"):
                i = 0 if x.name.endswith("_sum") else 1
                s.compute.setdefault(f"{lb['tenant']}/{lb['model']}", [0.0, 0.0])[i] = v
            elif x.name in ("mmhost_batch_size_sum", "mmhost_batch_size_count"):
                i = 0 if x.name.endswith("_sum") else 1
                s.rows.setdefault(f"{lb['tenant']}/{lb['model']}", [0.0, 0.0])[i] = v
            elif x.name == "mmhost_model_memory_bytes":
                s.memory[f"{lb['tenant']}/{lb['model']}/{lb['version']}"] = int(v)
    return s


def loads_between(prev: HostdScrape, cur: HostdScrape, size: Callable[[str], float]) -> tuple[float, float]:
    """(loads, their bytes): the loads one host finished between two scrapes; `size("tenant/model")` is the
    bytes of one load of that model."""
    count, nbytes = 0.0, 0.0
    for key, n in cur.loads.items():
        d = n - prev.loads.get(key, 0.0)
        if d > 0:
            count += d
            nbytes += d * size(key)
    return count, nbytes


def load_sample(prev: HostdScrape, cur: HostdScrape, sizes: Mapping[str, int], version: str = "1") -> dict[str, Any] | None:
    """The loads one host finished between two scrapes, as one calibrate() load sample; None when there
    were none or they came from more than one tier."""
    count, nbytes = loads_between(prev, cur, lambda key: sizes[f"{key}/{version}"])
    if count <= 0:
        return None
    tiers = [t for t, n in cur.tiers.items() if n - prev.tiers.get(t, 0.0) > 0]
    if len(tiers) != 1:
        return None
    return {"tier": tiers[0], "count": count, "bytes": nbytes, "seconds": cur.load_seconds - prev.load_seconds}


def batch_samples(scrapes: Iterable[HostdScrape], version: str = "1") -> list[dict[str, Any]]:
    """One calibrate() batch sample per model: mean rows per batch and mean seconds per batch, all hosts."""
    secs: dict[str, list[float]] = {}
    rows: dict[str, float] = {}
    for s in scrapes:
        for key, (sec, n) in s.compute.items():
            acc = secs.setdefault(key, [0.0, 0.0])
            acc[0] += sec
            acc[1] += n
        for key, (r, _) in s.rows.items():
            rows[key] = rows.get(key, 0.0) + r
    return [{"model": f"{k}/{version}", "size": rows.get(k, n) / n, "seconds": sec / n}
            for k, (sec, n) in sorted(secs.items()) if n > 0]


def measured_sizes(scrapes: Iterable[HostdScrape]) -> dict[str, int]:
    """Each model's measured memory over a run's scrapes: the median of the readings seen while it was
    resident (a CPU reading varies from load to load; the gauge disappears on eviction)."""
    seen: dict[str, list[int]] = {}
    for s in scrapes:
        for k, v in s.memory.items():
            seen.setdefault(k, []).append(v)
    return {k: int(np.median(v)) for k, v in seen.items()}
