"""hostd's Prometheus metrics, on a registry owned by the server (injected, never module-global).
Names are in the mmhost_ namespace with base units.

Next to them, Triton's own series, so that Triton dashboards, perf_analyzer `--collect-metrics` and Model
Analyzer find what they look for (hostd/triton_metrics.py): `nv_inference_*` per model version, read from the
Triton statistics (hostd/stats.py) at scrape time, and `nv_gpu_*` from NVML on a GPU. Also the standard
`process_*` and `python_*` series (resident memory, open files, CPU, GC) for OOM triage."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ground.looplag import LAG_BUCKETS
from ground.metrics_http import register_process_collectors
from hostd.triton_metrics import GpuCollector, ModelsFn, TritonCollector

_LAT = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30)
_BATCH = (1, 2, 4, 8, 16, 32, 64, 128, 256)
_LOAD = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120)


class HostdMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        self.requests = Counter(
            "mmhost_requests", "Inference requests answered, by gRPC status", ["tenant", "model", "status"], registry=r
        )
        self.request_duration = Histogram(
            "mmhost_request_duration_seconds", "Time from arrival to answer", ["tenant", "model"], buckets=_LAT, registry=r
        )
        self.queue_duration = Histogram(
            "mmhost_queue_duration_seconds", "Time a request waited in its model's queue", ["tenant", "model"],
            buckets=_LAT, registry=r,
        )
        self.compute_duration = Histogram(
            "mmhost_compute_duration_seconds", "Time one batch took to execute", ["tenant", "model"],
            buckets=_LAT, registry=r,
        )
        self.batch_size = Histogram(
            "mmhost_batch_size", "Rows per executed batch", ["tenant", "model"], buckets=_BATCH, registry=r
        )
        self.queue_depth = Gauge("mmhost_queue_depth", "Requests waiting per model", ["tenant", "model"], registry=r)
        self.shed = Counter(
            "mmhost_requests_shed", "Requests refused before reaching a model, by reason", ["tenant", "model", "reason"],
            registry=r,
        )
        self.loads = Counter("mmhost_model_loads", "Model loads by result", ["tenant", "model", "result"], registry=r)
        self.load_duration = Histogram(
            "mmhost_model_load_duration_seconds", "Load time split by phase (fetch, verify, prepare, deserialize, warmup; "
            "prepack: weights repacked in the background after a reload answered, hostd/loader.py)",
            ["phase"], buckets=_LOAD, registry=r,
        )
        self.load_path = Histogram(
            "mmhost_model_load_path_seconds", "Where a load's time goes beyond its phases, by stage: evict (room made, "
            "victims unloaded), pool_wait (queued for a load worker), lock_wait (for the loader's lock: one deserialize "
            "at a time), locked (deserialize, warm-up and memory probes under it), total (load started to READY)",
            ["stage"], buckets=_LOAD, registry=r,
        )
        self.loop_lag = Histogram(
            "mmhost_event_loop_lag_seconds", "How late the event loop ran a timer that was due (sampled 20 times a "
            "second): the wait every request's callbacks have behind the others' work on this process's one loop",
            buckets=LAG_BUCKETS, registry=r,
        )
        self.execution_slots = Gauge("mmhost_execution_slots", "Batches that may run at once on this host", registry=r)
        self.load_workers = Gauge(
            "mmhost_load_workers", "Load threads: loads, unloads and RAM-tier fills running at once (the rest queue)",
            registry=r,
        )
        self.models_resident = Gauge("mmhost_models_resident", "Models READY on this host", registry=r)
        self.model_memory = Gauge(
            "mmhost_model_memory_bytes", "Measured device memory per resident model", ["tenant", "model", "version"],
            registry=r,
        )
        self.draining = Gauge("mmhost_draining", "1 while the server drains after SIGTERM", registry=r)
        self.slot_wait = Histogram(
            "mmhost_execution_slot_wait_seconds", "Time a ready batch waited for a device execution slot, by tenant",
            ["tenant"], buckets=_LAT, registry=r,
        )
        self.env_shares_overridden = Gauge(
            "mmhost_tenant_env_shares_overridden", "Tenants whose MMHOST_HOSTD_TENANT_SHARES share the tenant "
            "registry overrides (the registry wins)", registry=r)
        self.cache = CacheMetrics(r)
        self.triton = TritonCollector()
        self.gpu = GpuCollector()
        for c in (self.triton, self.gpu):
            r.register(c)
        register_process_collectors(r)
        # each answer's series, bound once (labels() validates and locks on every call): as many as the
        # registry holds already, unknown model names sharing one
        self._request_children: dict[tuple[str, str, str], tuple] = {}

    def request_series(self, tenant: str, model: str, status: str) -> tuple:
        """(requests counter, request duration histogram) children for one answer: bound on first use, then
        one dict lookup (as RouterMetrics.tenant_seconds)."""
        key = (tenant, model, status)
        children = self._request_children.get(key)
        if children is None:
            children = self._request_children[key] = (self.requests.labels(tenant, model, status),
                                                       self.request_duration.labels(tenant, model))
        return children

    def watch(self, models: ModelsFn, probe=None) -> None:
        """Serve Triton's series from these model entries (read at scrape time: no per-request cost) and,
        when `probe` is NVML, the GPU's."""
        self.triton.models = models
        self.gpu.probe = probe



class CacheMetrics:
    """The tiered cache: hits and misses by tier, evictions by reason, bytes per tier and tenant, NVML."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.hits = Counter("mmhost_cache_hits", "Lookups served by a tier (device, ram, disk; graph: loads from a "
                            "saved optimized graph)", ["tier"], registry=r)
        self.misses = Counter("mmhost_cache_misses", "Lookups a tier could not serve", ["tier"], registry=r)
        self.evictions = Counter(
            "mmhost_cache_evictions", "Models evicted from a tier, by reason (capacity, watermark, explicit, share)",
            ["tier", "reason"], registry=r,
        )
        self.bytes = Gauge("mmhost_cache_bytes", "Bytes held per tier", ["tier"], registry=r)
        self.budget = Gauge("mmhost_cache_budget_bytes", "Byte budget per tier", ["tier"], registry=r)
        self.watermark = Gauge("mmhost_cache_watermark_bytes", "Device watermarks in bytes", ["level"], registry=r)
        self.tenant_bytes = Gauge("mmhost_tenant_device_bytes", "Device bytes held per tenant", ["tenant"], registry=r)
        self.device_used = Gauge("mmhost_device_memory_used_bytes", "Device memory in use (NVML; RSS on CPU)", registry=r)
        self.device_total = Gauge("mmhost_device_memory_total_bytes", "Device memory total", registry=r)
        self.device_util = Gauge("mmhost_device_utilization_ratio", "GPU utilization 0..1 (NVML; absent on CPU)", registry=r)
        self.disk_free = Gauge("mmhost_cache_disk_free_bytes", "Free bytes on the disk tier's filesystem", registry=r)
        self.disk_capacity = Gauge("mmhost_cache_disk_capacity_bytes", "Size of the disk tier's filesystem", registry=r)
        self.load_refused = Counter(
            "mmhost_model_load_refused", "Loads refused for lack of device memory", ["tenant", "model"], registry=r
        )
