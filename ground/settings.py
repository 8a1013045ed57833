"""Settings, parsed once in the entry point and passed down. Every field can come from the environment
(prefix shown per class) or from the command line, which overrides the environment."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from ground.eventloop import EventLoopKind
from ground.manifest import NAME_RE as _GROUP_KEY_RE
from ground.units import parse_bytes
from ground.wire import HEARTBEAT_PREFIX

_GROUP_RE = re.compile(r"^[A-Za-z0-9_.-]{0,64}$")  # a host group's name; "" = the shared pool


class S3Settings(BaseSettings):
    """S3-compatible object storage (AWS, MinIO, Ceph, R2). Credentials come from the standard AWS chain
    (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_PROFILE / instance roles), never from here."""

    model_config = SettingsConfigDict(env_prefix="MMHOST_S3_")

    endpoint_url: str | None = Field(None, description="e.g. http://minio:9000; unset for AWS")
    region: str = Field("us-east-1", description="signing region")
    addressing_style: Literal["auto", "path", "virtual"] = Field("path", description="path-style for MinIO/Ceph")
    max_attempts: int = Field(4, ge=1, description="botocore retry attempts (standard mode, with backoff)")
    connect_timeout_s: float = Field(2.0, gt=0, description="fail fast when storage is down")
    read_timeout_s: float = Field(20.0, gt=0)
    multipart_threshold: int = Field(8 << 20, ge=5 << 20, description="bytes; larger objects move in parts")
    multipart_chunksize: int = Field(8 << 20, ge=5 << 20, description="bytes per ranged part")
    max_concurrency: int = Field(8, ge=1, description="parallel parts per transfer")
    ranged_get_min_bytes: int | None = Field(
        None, ge=0,
        description="model loads read objects of at least this many bytes into memory in parallel ranged GETs "
        "(multipart_chunksize each, max_concurrency at once), smaller ones in one GET. Unset: multipart_threshold "
        "for a remote store (one S3 connection carries ~50-100 MB/s, parts add up), never for a store on this "
        "machine (127.0.0.1, localhost: no network to fill; the server's CPU is the limit and ranges only add "
        "requests). 0: always one GET",
    )
    checksums: Literal["when_required", "when_supported"] = Field(
        "when_required",
        description="botocore request/response checksums; 'when_required' suits every S3-compatible store "
        "(integrity is checked end to end by sha256 in the manifest anyway)",
    )


class HostdSettings(BaseSettings):
    """One host daemon (one per GPU)."""

    model_config = SettingsConfigDict(env_prefix="MMHOST_HOSTD_", populate_by_name=True)

    listen: str = Field(
        "127.0.0.1:8101", description="gRPC address (v2 + Triton extensions); not Triton's 8001, so a Triton "
        "client pointed at the usual port never reaches a hostd past the router",
    )
    metrics_port: int = Field(9101, ge=0, le=65535, description="Prometheus port; 0 turns it off")
    host_group: str = Field(
        "", pattern=_GROUP_RE.pattern, description="placement group this host belongs to: routers place a "
        "model only on hosts of the group RouterSettings.host_groups gives it (a dedicated pool for a noisy model or "
        "tenant, docs/host-groups.md); '' = the shared pool",
    )
    metrics_host: str = Field("127.0.0.1", description="Prometheus bind address")
    store: str = Field(
        "./model_store", validation_alias=AliasChoices("MMHOST_HOSTD_STORE", "MMHOST_STORE"),
        description="model store: a folder, file:// or s3://bucket/prefix (MMHOST_STORE, shared, when unset)",
    )
    health_port: int = Field(
        0, ge=0, le=65535, description="also serve the gRPC health service alone, in plaintext, on this port (same "
        "host as listen) for kubelet probes, which cannot speak TLS; 0 = off (health on the main port only)",
    )
    tls_cert: Path | None = Field(
        None, description="serving certificate (PEM; re-read when the file changes); with tls_key. Unset = "
        "plaintext, which needs plaintext=true",
    )
    tls_key: Path | None = Field(None, description="private key of tls_cert (PEM)")
    tls_client_ca: Path | None = Field(
        None, description="mutual TLS: every call must present a client certificate signed by this CA and "
        "naming tls_client_identity, checked before any mmhost-tenant metadata is read",
    )
    tls_client_identity: str = Field(
        "mmhost://router", description="identity (SAN URI or CN) a client certificate must carry "
        "(ground.tls.ROUTER_IDENTITY), so a tenant certificate from the same CA cannot call a hostd",
    )
    plaintext: bool = Field(
        False, description="serve without TLS: only for the demo, tests and a host reachable by nothing but "
        "its routers; required when tls_cert is unset",
    )
    data_port: int = Field(
        0, ge=-1, le=65535, description="routers' ModelInfer calls on a TCP connection (the data link, "
        "ground/framelink.py: no gRPC stream per router and model), on listen's host; 0 = any free port, -1 = off. "
        "Advertised in the host's status. With tls_cert it serves TLS with the same certificate and, with "
        "tls_client_ca, the same check of the router's certificate (ground/link_tls.py)",
    )
    tls_without_client_auth: bool = Field(
        False, description="serve TLS (tls_cert) without tls_client_ca: any caller that completes a TLS handshake "
        "may name any tenant in mmhost-tenant. Refused unless this is set (the port is reachable by routers "
        "alone, e.g. behind a NetworkPolicy) or dev_mode is on",
    )
    dev_mode: bool = Field(
        False, description="development mode: calls without mmhost-tenant metadata run as default_tenant. "
        "Off in every deployment: a hostd then refuses calls that name no tenant",
    )
    default_tenant: str = Field(
        "demo", description="dev_mode only: the tenant of direct calls that carry no mmhost-tenant metadata",
    )
    preload: bool = Field(False, description="load every stored model at start instead of on first request")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto uses CUDA when present")
    ort_intra_op_threads: int = Field(
        0, ge=0, description="ONNX Runtime intra-op threads per session; 0 = auto: cores // execution_slots on CPU "
        "(running batches never oversubscribe the cores), 1 on a GPU. A value that would oversubscribe is lowered",
    )
    ort_spinning: bool = Field(
        False, description="let ONNX Runtime's intra-op threads spin between runs (lower latency on an idle, dedicated machine)"
    )
    torch_threads: int = Field(0, ge=0, description="torch intra-op threads; 0 = auto, as ort_intra_op_threads")
    wide_lone_batches: bool = Field(
        True, description="CPU, ONNX: a batch of one request alone on the host runs on every core (a second "
        "session over the same weights, without prepacking: +3 MB for the 50 MB MLP; it holds every execution slot "
        "meanwhile, at most 5 ms; hostd/core/sizing.py). On by default since two bench/batching.py runs on a quiet "
        "2-core box put it ahead at c1 and c32 (c1 p50 1.39x and 1.56x the plain server's against 1.61x and 1.79x; "
        "c32 1275 and 1113 req/s against 1164 and 1087); on a box shared with other load it was slower (its two "
        "threads wait for each other when either loses its core): turn it off there",
    )
    wide_prepacked: bool = Field(
        False, description="the wide lone batches' session (wide_lone_batches) prepacks its weights like the "
        "model's own session: batch 1 of the 50 MB MLP on 2 threads in ~1.4 ms instead of ~1.7, for a second "
        "packed copy of the weights (+56 MB for that model, counted in its measured memory, so fewer models fit) "
        "and a first load that packs twice; reloads pack both in the background. Off by default: memory is the "
        "cache; turn it on for a CPU host that serves few models at low concurrency (docs/execution.md)",
    )
    idle_loop_lone_batches: bool = Field(
        True, description="a wide lone batch (wide_lone_batches) that arrives while the event loop was idle runs "
        "on the loop thread instead of a worker thread, once per idle spell (ground/loopidle.py): no thread hop, "
        "~0.4 ms of a ~3 ms request at concurrency 1 on 2 cores; a backlog of calls inside gRPC keeps the loop "
        "busy, so under load the batches stay on worker threads",
    )
    worker_continues_batches: bool = Field(
        True, description="a worker thread that finishes a batch starts its model's next batch itself when the "
        "host's dispatch starts one, instead of handing it back through the event loop to another thread wake-up "
        "(hostd/execution.py; docs/execution.md item 13)",
    )
    default_max_batch_size: int = Field(
        32, ge=0, description="max_batch_size for models with a dynamic first dimension that name none"
    )
    max_request_bytes: int = Field(64 << 20, gt=0, description="largest accepted request (all tensors)")
    inflight_bytes: str = Field(
        "512MiB", description="request bytes in flight in this hostd, all tenants together (ground/inflight_policy.py); "
        "past it requests get RESOURCE_EXHAUSTED inflight_bytes: bytes (512MiB) or a fraction of memory_limit; 0 = off",
    )
    tenant_inflight_bytes: str = Field(
        "", description="request bytes in flight of one tenant (bytes or a fraction of memory_limit); "
        "empty = a quarter of inflight_bytes; 0 = off",
    )
    memory_limit: str = Field("", description="the process's memory limit (the pod's), for fractional byte budgets")
    max_queue_size: int = Field(1024, ge=1, description="per-model queue bound when the manifest sets none")
    drain_timeout_s: float = Field(30.0, ge=0, description="on SIGTERM, wait this long for in-flight work")
    drain_linger_s: float = Field(
        1.0, ge=0, description="after the drain, keep answering UNAVAILABLE (retry elsewhere) this long before exiting"
    )
    cache_dir: Path = Field(Path("./.mmhost-cache"), description="local disk tier for model files")
    device_memory: str = Field(
        "0.8", description="device budget for resident models: bytes (8GiB) or a fraction of the device (0.8)"
    )
    high_watermark: float = Field(0.95, gt=0, le=1, description="evict when measured use passes this fraction")
    low_watermark: float = Field(0.85, gt=0, le=1, description="...down to this fraction of the budget")
    eviction_policy: Literal["lru", "gdsf", "gdsf-decay"] = Field(
        "lru", description="lru, gdsf (cost-aware), or gdsf-decay (cost-aware with a decaying frequency history "
        "that outlives evictions; hostd/cache/policy.py)")
    ram_cache_bytes: str = Field("2GiB", description="host RAM tier for model bytes; 0 turns it off")
    disk_cache_bytes: str = Field("20GiB", description="local disk tier bound")
    tenant_shares: str = Field(
        "", description='JSON: {"tenant": {"guaranteed": "25%", "maximum": "60%"}} of the device budget, read at start; '
        'a tenant whose registry record sets device_guaranteed/device_maximum (mmhost tenant set-limits, live) gets '
        'the registry\'s share instead (logged, mmhost_tenant_env_shares_overridden)'
    )
    failed_backoff_s: float = Field(1.0, gt=0, description="first retry delay after a failed load (doubles, max 60s)")
    storage_stall_s: float = Field(
        3.0, gt=0, description="a cold load whose download receives no bytes for this long answers its waiting "
        "requests UNAVAILABLE (storage_down) instead of holding them to their deadline")
    execution_slots: int = Field(
        0, ge=0, description="batches running on the device at once; 0 = auto (min(CPU cores, 4), or 4 on a GPU)",
    )
    execution_slots_per_model: int = Field(
        0, ge=0, description="slots one model may hold at once; 0 = auto: all but one when there are 2 or more, so "
        "another model's work finds a slot free (batches are not preempted)",
    )
    compute_nice: int = Field(
        12, ge=0, le=19, description="nice value of the threads that run and load models (Linux: per thread): the "
        "event loop, which answers every model's requests, goes first when both want a core; 0 = same priority",
    )
    switch_interval_s: float = Field(
        0.0005, ge=0, le=0.1, description="the interpreter's switch interval in hostd's process (sys.setswitchinterval; "
        "0 = Python's 5 ms): how long a model thread that finished or is about to start a batch waits for the GIL "
        "while the event loop holds it. 0.5 ms raised the concurrency-32 throughput 8-16% on 2 cores "
        "(docs/execution.md item 12)",
    )
    event_loop: EventLoopKind = Field(
        "asyncio", description="hostd's event loop (ground/eventloop.py): asyncio's own, whose selector tells when "
        "the loop was idle so that a lone batch may run on it (idle_loop_lone_batches), or uvloop's (compiled; "
        "no such batches on it)",
    )
    fair_unit: Literal["tenant", "model"] = Field(
        "model", description="what shares the execution slots fairly: tenant (by weight; a tenant's models in "
        "priority and arrival order), or model (by tenant weight, then equally among a tenant's models)",
    )
    tenant_limits: str = Field(
        "", description="embedded mode: tenant limits from a file, re-read when it changes: the routers' tenants "
        "file (mmhost tenant --tenants FILE) or {tenant: {tier, weight, instances, ...}}",
    )
    tenants_prefix: str = Field(
        "mmhost:tenants:", description="Redis mode: key prefix of the tenant registry (as the routers' tenants_prefix)"
    )
    tenants_refresh_s: float = Field(2.0, gt=0, description="how often tenant limits are re-read (Redis or file)")


class HeartbeatSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MMHOST_HOSTD_HEARTBEAT_", populate_by_name=True)

    redis_url: str | None = Field(
        None, validation_alias=AliasChoices("MMHOST_REDIS_URL", "MMHOST_HOSTD_HEARTBEAT_REDIS_URL"),  # 2nd: old name
        description="publish heartbeats here; unset = no heartbeats (routers poll static hosts)",
    )
    prefix: str = Field(HEARTBEAT_PREFIX, description="Redis key prefix")
    interval_s: float = Field(1.0, gt=0, description="seconds between heartbeats")
    ttl_s: float = Field(5.0, gt=0, description="a host whose last heartbeat is older than this drops out")
    advertise: str | None = Field(None, description="address routers should call; default the listen address")


class RouterSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MMHOST_ROUTER_", populate_by_name=True)

    listen: str = Field("127.0.0.1:8000", description="gRPC address tenants call (v2 + Triton extensions)")
    rest_listen: str = Field(
        "", description="also serve KServe v2 REST (HTTP/JSON + Triton's binary tensor extension) on this address, "
        "e.g. 127.0.0.1:8080, over the same handlers as gRPC (router/rest.py); '' or a port of 0 = off",
    )
    metrics_port: int = Field(9100, ge=0, le=65535, description="Prometheus port; 0 turns it off")
    metrics_host: str = Field("127.0.0.1", description="Prometheus bind address")
    event_loop: EventLoopKind = Field(
        "uvloop", description="the event loop of the router and its Python-lane workers (ground/eventloop.py): "
        "uvloop's (compiled: ~7% less CPU per request on the Python lane, bench/router.py) or asyncio's own",
    )
    health_port: int = Field(
        0, ge=0, le=65535, description="also serve the gRPC health service alone, in plaintext, on this port (same "
        "host as listen) for kubelet probes, which cannot speak TLS; 0 = off (health on the main port only)",
    )
    tls_cert: Path | None = Field(
        None, description="tenant-facing serving certificate (PEM; re-read when the file changes); with "
        "tls_key. Unset = plaintext, which needs plaintext=true",
    )
    tls_key: Path | None = Field(None, description="private key of tls_cert (PEM)")
    tls_client_ca: Path | None = Field(
        None, description="tenant client certificates signed by this CA (SAN URI mmhost://tenant/<t>) authenticate "
        "tenants, as an alternative to an API key: on tls_client_listen when set (listen keeps API keys), else on "
        "listen, which then requires one (gRPC cannot ask for an optional one); unset = API keys only",
    )
    tls_client_listen: str = Field(
        "", description="with tls_client_ca: a second tenant port (e.g. 0.0.0.0:8443) that requires a tenant "
        "client certificate, next to listen for API keys; '' = off",
    )
    plaintext: bool = Field(
        False, description="serve tenants without TLS: only for the demo and tests (which set it) or behind a "
        "TLS-terminating proxy in the same pod; required when tls_cert is unset",
    )
    hostd_ca: Path | None = Field(
        None, description="CA of hostd serving certificates: when set, routers call hostds over TLS (with "
        "hostd_client_cert/key: mutual TLS); unset = plaintext to hostds",
    )
    hostd_client_cert: Path | None = Field(
        None, description="the router's client certificate for hostds (SAN URI mmhost://router; PEM, re-read "
        "when it changes); with hostd_client_key",
    )
    hostd_client_key: Path | None = Field(None, description="private key of hostd_client_cert (PEM)")
    hostd_tls_name: str = Field(
        "mmhost-hostd", description="name hostd certificates are verified against, whatever address is dialled "
        "(hostds are dialled by pod IP); ground.tls.HOSTD_TLS_NAME",
    )
    redis_url: str | None = Field(
        None, validation_alias=AliasChoices("MMHOST_REDIS_URL", "MMHOST_ROUTER_REDIS_URL"),  # 2nd: old name
        description="Redis mode: hosts from heartbeats, tenants from the Redis registry",
    )
    hosts: list[str] = Field(default_factory=list, description="embedded mode: static hostd addresses, polled")
    tenants_file: Path | None = Field(None, description="embedded mode: tenants file (key hashes)")
    store: str | None = Field(
        None, validation_alias=AliasChoices("MMHOST_ROUTER_STORE", "MMHOST_STORE"),
        description="model store for the catalog (MMHOST_STORE, shared, when unset); unset = hosts answer NOT_FOUND",
    )
    uploads: bool = Field(
        False, description="serve mmhost.uploads.Uploads: tenants publish model versions with their API key, "
        "into `store` under their own prefix (router/uploads.py). Needs store, and a store credential that may "
        "write tenants/*/models/* (docs/storage.md, bucket policy)",
    )
    upload_max_bytes: str = Field("1GiB", description="largest model file a tenant may upload (bytes, e.g. 1GiB)")
    upload_concurrency: int = Field(
        2, ge=1, description="uploads received or validated at once by this router (one per tenant); past it "
        "RESOURCE_EXHAUSTED uploads_busy. Each holds up to upload_max_bytes on disk in upload_dir",
    )
    upload_dir: Path | None = Field(None, description="where uploads are received before validation; unset = the "
                                    "system's temporary folder")
    upload_idle_timeout_s: float = Field(
        30.0, gt=0, description="an upload whose next message does not arrive within this is refused "
        "(DEADLINE_EXCEEDED), so a stalled client does not hold one of the upload_concurrency places",
    )
    upload_validate_timeout_s: float = Field(
        120.0, gt=0, description="a model's validation (load and one inference on zeros, in a worker process) "
        "taking longer is killed and the upload refused",
    )
    catalog_prefix: str = Field("mmhost:catalog:", description="Redis key prefix of the catalog index")
    tenants_prefix: str = Field("mmhost:tenants:", description="Redis key prefix of the tenant registry")
    heartbeat_prefix: str = Field("mmhost:hosts:", description="Redis key prefix of hostd heartbeats")
    host_missing_grace_s: float = Field(
        2.0, ge=0, description="Redis mode: a host whose heartbeat is missing stays in the view this long "
        "(a flushed or failed-over Redis loses every heartbeat at once; live hosts beat again within their interval)",
    )
    fleet_quotas: bool = Field(
        True, description="Redis mode: tenants' rate and concurrency limits hold across all routers together "
        "(router/quota_policy.py); false = each router enforces them in full, as in embedded mode",
    )
    quota_prefix: str = Field("mmhost:quota:", description="Redis key prefix of fleet quotas (buckets, live routers)")
    quota_timeout_s: float = Field(
        0.25, gt=0, description="a Redis call for a token lease taking longer: this router falls back to its share "
        "of each limit (limit / routers seen) until Redis answers again",
    )
    quota_router_ttl_s: float = Field(3.0, gt=0, description="a router not heard from this long no longer counts")
    quota_router_id: str = Field(
        "", description="the name this router counts under among the live routers (fleet quotas); empty = a new "
        "one at each start. Set by a router for its Python-lane workers, which count as the router itself: a "
        "tenant's calls are on one of its processes at a time, so each limit is shared by routers, not processes",
    )
    refresh_interval_s: float = Field(0.5, gt=0, description="how often the host view and tenants refresh")
    poll_timeout_s: float = Field(1.0, gt=0, description="static mode: Status call timeout per host")
    catalog_ttl_s: float = Field(5.0, ge=0, description="how long a catalog lookup is reused")
    catalog_miss_ttl_s: float = Field(1.0, ge=0, description="how long 'no such model' is reused")
    max_attempts: int = Field(3, ge=1, description="tries per request (first try + retries on other hosts)")
    retry_budget_ratio: float = Field(0.2, ge=0, description="retries earned per request (retry budget)")
    retry_budget_cap: float = Field(100.0, ge=1, description="retry budget: most retries saved up")
    default_timeout_s: float = Field(0.0, ge=0, description="deadline for calls that set none; 0 = none")
    max_message_bytes: int = Field(64 << 20, gt=0, description="largest request or response forwarded")
    hostd_streams: int = Field(
        4, ge=0, le=64, description="ModelInfer calls go to each hostd on up to this many streams (HostdData.Infer, "
        "router/host_streams.py: no gRPC call per forward); 0 = one unary call per forward, as a C proxy would")
    hostd_data_link: bool = Field(
        True, description="a hostd's streams go on its data link (a TCP connection, HostStatus.data_port) when it "
        "has one, with mutual TLS when hostd_ca is set; off = gRPC streams (HostdData.Infer) always")
    hostd_stream_max_body_bytes: int = Field(
        256 << 10, ge=0, description="larger ModelInfer requests go as unary calls: one stream's messages are sent "
        "in order, so a big one would hold back the small ones behind it")
    inflight_bytes: str = Field(
        "256MiB", description="ModelInfer request bytes in flight in this router, all tenants together "
        "(ground/inflight_policy.py); past it requests get RESOURCE_EXHAUSTED inflight_bytes: bytes (256MiB) or a "
        "fraction of memory_limit; 0 = off",
    )
    tenant_inflight_bytes: str = Field(
        "", description="ModelInfer request bytes in flight of one tenant (bytes or a fraction of memory_limit); "
        "empty = a quarter of inflight_bytes; 0 = off",
    )
    memory_limit: str = Field("", description="the process's memory limit (the pod's), for fractional byte budgets")
    max_concurrent_streams: int = Field(
        0, ge=0, description="calls one client connection may have open at once (HTTP/2 max_concurrent_streams). "
        "Bounds the bytes one connection pushes in before the byte budget can refuse them (gRPC hands a body over "
        "only once it is whole), but calls a client opens before it sees the setting are reset (UNAVAILABLE, "
        "REFUSED_STREAM); 0 = gRPC's default (no bound)",
    )
    stream_window_bytes: int = Field(
        1 << 20, ge=0, description="bytes of one call's body a client may send before ModelInfer reads it (HTTP/2 stream "
        "window, fixed: no BDP probing); bounds what a refused call costs the router. 0 = gRPC's default",
    )
    max_unknown_names: int = Field(
        4096, ge=0, description="names the catalog did not know, remembered (per tenant and model, LRU) for "
        "catalog_miss_ttl_s; bounds the router's memory whatever names tenants send",
    )
    access_log: str | None = Field(None, description="access log file (JSON lines, router/accesslog.py); '-' = stdout "
                                   "(nothing else is written there: logs go to stderr); unset = off")
    access_log_max_bytes: str = Field("256MiB", description="an access log file past this size is rotated (FILE "
                                      "becomes FILE.1); 0 = never")
    access_log_backups: int = Field(5, ge=0, description="rotated access log files kept (FILE.1 .. FILE.N)")

    fast_lane: Literal["off", "haproxy"] = Field(
        "off", description="haproxy: HAProxy serves listen and forwards ModelInfer for unlimited tenants' READY models "
        "straight to the host, with no Python per request; everything else reaches this router through it "
        "(router/fastlane.py, docs/fast-lane.md); tenant TLS and mutual TLS to hostds as configured below")
    fast_lane_binary: str = Field("", description="the haproxy executable (2.6 or later); '' = haproxy on PATH")
    fast_lane_buffer_bytes: int = Field(
        65536, ge=16384, le=1 << 24, description="HAProxy's buffer: a ModelInfer body must fit whole to take the fast "
        "lane (larger ones take the Python lane, with its byte budget); HAProxy holds up to maxconn of them")
    fast_lane_maxconn: int = Field(4096, ge=16, description="HAProxy's connection limit (fast lane)")
    fast_lane_threads: int = Field(0, ge=0, le=64, description="HAProxy's threads (nbthread); 0 = one per CPU "
                                   "the router may use, its affinity lowered to its cgroup's CPU limit "
                                   "(ground/cpus.py; docs/fast-lane.md: what was measured)")
    fast_lane_check_interval_s: float = Field(1.0, gt=0, description="HAProxy's health checks of each host (TCP)")
    fast_lane_max_hosts: int = Field(64, ge=1, le=4096, description="hosts the fast lane can route to (HAProxy "
                                     "server slots); more hosts than this are served by the Python lane alone")
    fast_lane_workers: int = Field(
        0, ge=0, le=32, description="with fast_lane=haproxy: this many more router processes for the Python lane, "
        "each with an event loop of its own; HAProxy sends each tenant's ModelInfer calls to one of them or to this "
        "router, the busiest tenants to lanes of their own (router/lane_policy.py), so that one tenant's calls do "
        "not queue ahead of another's in one loop. Worker N logs to access_log.wN and serves metrics on a free "
        "loopback port, which this router's metrics port re-exports (router/lane_workers.py, docs/fast-lane.md)")
    fast_lane_rebalance_ratio: float = Field(
        1.1, ge=1.0, description="Python-lane workers: tenants move between router processes only when that lowers "
        "the busiest process's requests/s by more than this factor")

    hot_queue_depth: int = Field(8, ge=0, description="outstanding requests per copy that make a model hot")
    hot_rps_per_copy: float = Field(0.0, ge=0, description="requests/s per copy that make a model hot; 0 = off")
    pending_ttl_s: float = Field(30.0, gt=0, description="a load this router started counts as LOADING this long")
    host_groups: dict[str, str] = Field(
        default_factory=dict, description='JSON: {"tenant": "group", "tenant/model": "group"}: place these tenants\' '
        "models, or this one model, only on hostds whose host_group is that group (a dedicated pool); the rest only "
        "on hostds with no group. The model's entry wins over its tenant's; \"\" names the shared pool "
        "(router/host_groups.py)")

    @field_validator("host_groups")
    @classmethod
    def _host_groups(cls, v: dict[str, str]) -> dict[str, str]:
        for key, group in v.items():
            parts = key.split("/")
            if not 1 <= len(parts) <= 2 or not all(_GROUP_KEY_RE.match(p) for p in parts):
                raise ValueError(f"host_groups: {key!r} is neither a tenant nor tenant/model")
            if not _GROUP_RE.match(group):
                raise ValueError(f"host_groups: group {group!r} of {key!r}: at most 64 of letters, digits, '_', '.', '-'")
        return v

    @field_validator("access_log_max_bytes")
    @classmethod
    def _access_log_max_bytes(cls, v: str) -> str:
        parse_bytes(v)  # refused here, at startup, not at the first rotation
        return v
