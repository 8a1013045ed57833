"""Triton's Prometheus series, so that tools built for Triton read a hostd: Triton's dashboards,
perf_analyzer `--collect-metrics`, Model Analyzer.

`nv_inference_*`: cumulative counts and microseconds per model version, computed at scrape time from the
Triton statistics each model entry already keeps (hostd/stats.py ModelStats), so a request costs nothing
more. Labels are Triton's `model` and `version`, plus `tenant`: in mmhost a model name belongs to a tenant,
and two tenants may both have a "resnet". A query written for Triton (`sum by (model) (rate(...))`) still
works; it adds the tenants that share a name, which `{tenant="..."}` separates.

Triton exposes these as counters without a `_total` suffix; prometheus_client would add one to a counter,
so they are exposed untyped under Triton's exact names (PromQL's rate() works the same).

`nv_gpu_memory_used_bytes`, `nv_gpu_memory_total_bytes`, `nv_gpu_utilization` (label `gpu_uuid`): read from
NVML at scrape time when the host's memory probe is NVML; absent on CPU, as in Triton."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from hostd.stats import Duration, ModelStats

# (tenant, model, version) -> the entry holding .stats; read from the scrape thread, so a snapshot list
ModelsFn = Callable[[], Iterable[tuple[tuple[str, str, str], object]]]

# name, help, value from a ModelStats
_COUNTERS: tuple[tuple[str, str, Callable[[ModelStats], float]], ...] = (
    ("nv_inference_request_success", "Number of successful inference requests, all batch sizes",
     lambda s: s.success.count),
    ("nv_inference_request_failure", "Number of failed inference requests, all batch sizes", lambda s: s.fail.count),
    ("nv_inference_count", "Number of inferences performed (a batch of n counts n)", lambda s: s.inference_count),
    ("nv_inference_exec_count", "Number of model executions performed (a batch counts once)",
     lambda s: s.execution_count),
    ("nv_inference_request_duration_us", "Cumulative inference request duration in microseconds (queue and "
     "compute included)", lambda s: _us(s.success) + _us(s.fail)),
    ("nv_inference_queue_duration_us", "Cumulative inference queuing duration in microseconds",
     lambda s: _us(s.queue)),
    ("nv_inference_compute_input_duration_us", "Cumulative compute input duration in microseconds",
     lambda s: _us(s.compute_input)),
    ("nv_inference_compute_infer_duration_us", "Cumulative compute inference duration in microseconds",
     lambda s: _us(s.compute_infer)),
    ("nv_inference_compute_output_duration_us", "Cumulative inference compute output duration in microseconds",
     lambda s: _us(s.compute_output)),
)
LABELS = ("model", "version", "tenant")


def _us(d: Duration) -> float:
    return d.ns // 1000


class TritonCollector(Collector):
    """nv_inference_* from the model entries `models` returns (none until hostd's server sets it)."""

    def __init__(self, models: ModelsFn | None = None) -> None:
        self.models = models

    def collect(self) -> Iterable[Metric]:
        rows = list(self.models()) if self.models is not None else []
        for name, doc, value in _COUNTERS:
            m = Metric(name, doc, "unknown")
            for (tenant, model, version), entry in rows:
                stats = getattr(entry, "stats", None)
                if stats is not None:
                    m.add_sample(name, {"model": model, "version": version, "tenant": tenant}, float(value(stats)))
            yield m


class GpuCollector(Collector):
    """nv_gpu_* from an NVML memory probe (hostd/memory.py NvmlProbe); nothing for any other probe."""

    def __init__(self, probe=None) -> None:
        self.probe = probe

    def collect(self) -> Iterable[Metric]:
        p = self.probe
        uuid = getattr(p, "uuid", None)
        if p is None or uuid is None:
            return
        labels = {"gpu_uuid": uuid}
        for name, doc, read in (
            ("nv_gpu_memory_used_bytes", "GPU used memory, in bytes", p.used),
            ("nv_gpu_memory_total_bytes", "GPU total memory, in bytes", p.total),
            ("nv_gpu_utilization", "GPU utilization rate [0.0 - 1.0)", p.utilization),
        ):
            value = read()
            if value is not None:
                g = GaugeMetricFamily(name, doc, labels=list(labels))
                g.add_metric(list(labels.values()), float(value))
                yield g
