"""The router's Prometheus metrics, in their own registry (injected, never module-global), with the standard
process_* and python_* series.

Tenants' view of latency: `mmhost_router_tenant_request_seconds{tenant}`, receipt to answer of every ModelInfer
a tenant sent (refusals included: a refusal is an answer the tenant waited for), the series the latency SLO
alert reads. One label, the authenticated tenant (bounded by the tenant registry; never a model, so a tenant
cannot grow the series by naming models), 12 buckets; each tenant's child is bound once and kept
(`tenant_seconds(tenant)`), so a request pays one dict lookup and one observe."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ground.looplag import LAG_BUCKETS
from ground.metrics_http import register_process_collectors


# the tenant-facing SLO histogram: 1 s (the shipped p99 SLO in deploy/prometheus) is a bucket boundary
TENANT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class RouterMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter("mmhost_router_requests_total", "Inference requests by outcome",
                                ["tenant", "model", "status"], registry=r)
        self.loop_lag = Histogram(
            "mmhost_router_event_loop_lag_seconds", "How late the router's event loop ran a timer that was due "
            "(sampled 20 times a second): the wait every call's callbacks have behind the others' work",
            buckets=LAG_BUCKETS, registry=r,
        )
        self.forward_seconds = Histogram(
            "mmhost_router_forward_seconds", "Time from receipt to answer, retries included",
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30), registry=r)
        self.retries = Counter("mmhost_router_retries_total", "Requests retried on another host", ["reason"], registry=r)
        self.retry_budget_exhausted = Counter("mmhost_router_retry_budget_exhausted_total",
                                              "Retries refused because the retry budget was spent", registry=r)
        self.hosts_up = Gauge("mmhost_router_hosts_up", "Hosts in the local view that take requests", registry=r)
        self.hostd_streams = Gauge("mmhost_router_hostd_streams", "Streams open to hostds for ModelInfer calls "
                                   "(router/host_streams.py: per model and host, closed after a minute idle)", registry=r)
        self.hostd_stream_ends = Counter(
            "mmhost_router_hostd_stream_ends_total", "Streams to hostds that ended other than by the router closing "
            "them, by outcome: broken (transport failure or the host ended it; its calls failed as a host down) or "
            "unsupported (a hostd without HostdData: its calls went unary) or link_unreachable (the host's data link could "
            "not be connected to: its calls went on gRPC streams)", ["outcome"], registry=r)
        self.group_hosts_up = Gauge("mmhost_router_host_group_hosts_up", "Hosts in the local view that take "
                                    "requests, per host group ('' = the shared pool; only with host_groups set)",
                                    ["group"], registry=r)
        self.hosts_marked_down = Counter("mmhost_router_hosts_marked_down_total", "Hosts marked down after a failure",
                                         registry=r)
        self.placements = Counter("mmhost_router_placements_total", "Placement decisions by rule", ["reason"], registry=r)
        self.replications = Counter("mmhost_router_replications_total", "Extra copies of hot models started", registry=r)
        self.access_log_dropped = Counter("mmhost_router_access_log_dropped_total",
                                          "Access log lines dropped because too many were waiting to be written",
                                          registry=r)
        self.unauthenticated = Counter("mmhost_router_unauthenticated_total", "Calls refused for a missing or wrong key",
                                       registry=r)
        self.shed = Counter("mmhost_requests_shed", "Requests refused before reaching a model, by reason "
                            "(the router's own refusals; hostds count theirs)", ["tenant", "model", "reason"], registry=r)
        self.admitted_inflight = Gauge("mmhost_router_admitted_inflight", "Requests admitted and not yet answered",
                                       registry=r)
        self.view_refresh_errors = Counter("mmhost_router_view_refresh_errors_total",
                                           "Failed refreshes of the host view or tenants", ["what"], registry=r)
        self.quota_mode = Gauge("mmhost_router_quota_mode", "Redis mode: 1 on how tenant limits hold now: fleet "
                                "(across all routers, through Redis) or local (Redis unreachable: limit / routers seen)",
                                ["mode"], registry=r)
        self.uploads = Counter("mmhost_router_uploads_total", "Tenant uploads (router/uploads.py) by outcome: ok, or "
                               "the refusal's reason", ["tenant", "outcome"], registry=r)
        self.upload_bytes = Counter("mmhost_router_upload_bytes_total", "Model file bytes received from tenants",
                                    ["tenant"], registry=r)
        self.uploads_in_progress = Gauge("mmhost_router_uploads_in_progress", "Uploads being received, validated "
                                         "or stored", registry=r)
        self.upload_validate_seconds = Histogram(
            "mmhost_router_upload_validate_seconds", "Validation of an uploaded model (worker process: start, load, "
            "one inference on zeros)", buckets=(0.5, 1, 2, 5, 10, 30, 60, 120, 300), registry=r)
        self.tenant_request_seconds = Histogram(
            "mmhost_router_tenant_request_seconds", "ModelInfer time from receipt to answer, as each tenant sees it "
            "(retries and refusals included)", ["tenant"], buckets=TENANT_BUCKETS, registry=r)
        self._tenant_children: dict[str, Histogram] = {}
        # Redis mode only (registered by redis_mode()): 1 while the router's reads of the host view from Redis
        # answer, 0 while they fail (the router then keeps its last view). Absent in embedded mode.
        self.redis_up = Gauge("mmhost_router_redis_up", "Redis mode: 1 while the last read of the host view from "
                              "Redis answered, 0 while it fails", registry=None)
        # fast_lane=haproxy only (registered by fast_lane_mode(); router/fastlane.py)
        self.fast_lane_up = Gauge("mmhost_router_fast_lane_up", "Fast lane: 1 while HAProxy runs", registry=None)
        self.fast_lane_routes = Gauge("mmhost_router_fast_lane_routes", "Fast lane: model versions HAProxy routes "
                                      "straight to a host", registry=None)
        self.fast_lane_requests = Counter("mmhost_router_fast_lane_requests_total", "Fast lane: ModelInfer requests "
                                          "HAProxy sent straight to a host (the router's other series count them "
                                          "too)", registry=None)
        self.fast_lane_restarts = Counter("mmhost_router_fast_lane_restarts_total", "Fast lane: HAProxy exits "
                                          "(started again)", registry=None)
        self.fast_lane_tls_reloads = Counter("mmhost_router_fast_lane_tls_reloads_total", "Fast lane: rotated "
                                             "certificate files sent to HAProxy (outcome ok: taken, new connections "
                                             "use them; failed: HAProxy keeps the previous ones, sent again at the "
                                             "next refresh)", ["outcome"], registry=None)
        self.fast_lane_syncs = Counter("mmhost_router_fast_lane_syncs_total", "Fast lane: refreshes that gave "
                                       "HAProxy the router's hosts, keys and routes", registry=None)
        self.fast_lane_log_dropped = Gauge("mmhost_router_fast_lane_log_dropped", "Fast lane: log lines HAProxy "
                                           "dropped since it started (a full pipe to the router): those requests "
                                           "are missing from the access log and the request series", registry=None)
        # fast_lane_workers > 0 only (registered by lane_workers_mode(); router/lane_workers.py)
        self.lane_workers_up = Gauge("mmhost_router_lane_workers_up", "Python-lane workers serving (router "
                                     "processes behind HAProxy besides this one)", registry=None)
        self.lane_worker_restarts = Counter("mmhost_router_lane_worker_restarts_total", "Python-lane workers that "
                                            "exited and were started again", registry=None)
        self.lane_tenants = Gauge("mmhost_router_lane_tenants", "Tenants whose Python-lane calls each router "
                                  "process serves (lane 0: this router)", ["lane"], registry=None)
        self.lane_rate = Gauge("mmhost_router_lane_requests_per_second", "Python-lane ModelInfer calls/s each router "
                               "process serves, as HAProxy counted them lately (lane 0: this router)", ["lane"],
                               registry=None)
        self.lane_moves = Counter("mmhost_router_lane_moves_total", "Tenants moved from one Python-lane router "
                                  "process to another (router/lane_policy.py)", registry=None)
        self.lane_worker_metrics_failures = Counter(
            "mmhost_router_lane_worker_metrics_failures_total", "Scrapes of this port that left a Python-lane "
            "worker's series out: the worker's own metrics port did not answer (restarting, stopped)", ["lane"],
            registry=None)
        register_process_collectors(r)

    def answered(self, tenant: str, model: str, status: str, seconds: float) -> None:
        """One ModelInfer answered (the Python lane's, or the fast lane's from HAProxy's log): its outcome, its
        time, and the tenant's view of it."""
        self.requests.labels(tenant, model, status).inc()
        self.forward_seconds.observe(seconds)
        self.tenant_seconds(tenant).observe(seconds)

    def tenant_seconds(self, tenant: str) -> Histogram:
        """The tenant's pre-bound histogram child (bound on first use, then one dict lookup)."""
        child = self._tenant_children.get(tenant)
        if child is None:
            child = self._tenant_children[tenant] = self.tenant_request_seconds.labels(tenant)
        return child

    def fast_lane_mode(self) -> None:
        """Export the fast lane's series (a router with fast_lane=haproxy)."""
        for m in (self.fast_lane_up, self.fast_lane_routes, self.fast_lane_requests, self.fast_lane_restarts,
                  self.fast_lane_syncs, self.fast_lane_log_dropped, self.fast_lane_tls_reloads):
            self.registry.register(m)

    def lane_workers_mode(self) -> None:
        """Export the Python-lane workers' series (fast_lane_workers > 0)."""
        for m in (self.lane_workers_up, self.lane_worker_restarts, self.lane_tenants, self.lane_rate, self.lane_moves,
                  self.lane_worker_metrics_failures):
            self.registry.register(m)

    def redis_mode(self) -> None:
        """Export mmhost_router_redis_up (a router with Redis)."""
        self.registry.register(self.redis_up)
