"""The router's composition root: settings in, a running server out. Wires the tenant registry, key index,
admission quotas, catalog, host view and its source (Redis heartbeats or static hosts), forwarder, dispatcher,
metrics, access log and servicer, and the clocks they read; starts and stops the background refreshes;
SIGTERM/SIGINT stop it."""

from __future__ import annotations

import asyncio
import gc
import logging
import random
import time
import uuid

from grpc import aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from ground import eventloop, tls
from ground.looplag import watch_loop_lag
from ground.metrics_http import MetricsServer, serve_metrics
from ground.metrics_merge import MergedCollector, merged_registry
from ground.serving import exit_after, run_until_signal
from ground.settings import S3Settings
from ground.units import parse_bytes
from ground.wire import UPLOADS_SERVICE
from protos import grpc_service_pb2
from router.accesslog import AccessLog
from router.admission import Admission
from router.auth import KeyIndex
from router.cluster import ClusterView, HeartbeatReader, StaticHosts
from router.directory import ModelDirectory
from router.dispatcher import Dispatcher
from router.fleet_quota import FleetQuota
from router.failover import RetryBudget
from router.fastlane import FastLane, FastLaneError
from router.fastlane_config import FastRecord, ready_version
from router.host_groups import hosts_per_group
from router.forward import SERVICE, Forwarder
from router.lane_workers import LaneWorkers
from router.local_load import LocalLoad
from router.metrics import RouterMetrics
from router.placement_policy import placement_config
from router.rest import RestServer, rest_enabled
from router.servicer import SHED_CODES, RouterServicer
from ground.settings import RouterSettings
from router.tenants import FileTenants, RedisTenants, TenantFeed, TenantRegistry
from router.uploads import Uploads

log = logging.getLogger(__name__)
DROPPED_EVERY_S = 5.0  # how often the fast lane's dropped log lines are read from HAProxy


def open_catalog(settings: RouterSettings, s3: S3Settings | None, redis_client):
    if not settings.store:
        return None
    from catalog.index import RedisCatalog, StorageCatalog
    from storage_adapters import open_storage
    from catalog.repository import ModelRepository

    repo = ModelRepository(open_storage(settings.store, s3))
    return RedisCatalog(redis_client, repo, settings.catalog_prefix) if redis_client is not None else StorageCatalog(repo)


class Router:
    def __init__(self, settings: RouterSettings, s3: S3Settings | None = None) -> None:
        self.settings = s = settings
        self.clock, self.wall_clock = time.monotonic, time.time  # the only clocks the router reads
        self.metrics = RouterMetrics()
        try:  # no certificates and no plaintext=true, or unusable files: it stops here, before anything starts
            self.creds = tls.router_credentials(s)
            self.cert_creds = tls.router_client_cert_credentials(s)  # tls_client_listen: tenant certificates
            hostd_tls, hostd_options = tls.router_to_hostd(s)
        except (OSError, ValueError) as e:  # TLSConfigError is a ValueError
            msg = str(e) if str(e).startswith("router:") else f"router: {e}"
            raise SystemExit(f"{msg} (settings tls_cert, tls_key, tls_client_ca, plaintext, hostd_ca, "
                             "hostd_client_cert, hostd_client_key; env MMHOST_ROUTER_*)") from None
        ends = self.metrics.hostd_stream_ends
        self.forwarder = Forwarder(s.max_message_bytes, hostd_tls, hostd_options, streams=s.hostd_streams,
                                   stream_max_body_bytes=s.hostd_stream_max_body_bytes,
                                   on_stream_end=lambda outcome: ends.labels(outcome).inc(),
                                   tls_name=s.hostd_tls_name)
        self.fastlane: FastLane | None = None  # fast_lane=haproxy: made in start(), once the router's own port is known
        self._dropped_read_at = -float("inf")
        if s.fast_lane == "haproxy":
            if s.tls_client_ca is not None and not s.tls_client_listen:
                raise SystemExit("router: fast_lane=haproxy takes API keys on listen: tenant client certificates "
                                 "need their own port (tls_client_listen), served by this router")
            if s.listen.rsplit(":", 1)[-1] in ("", "0"):
                raise SystemExit("router: fast_lane=haproxy needs a fixed port in listen (HAProxy binds it)")
            self.metrics.fast_lane_mode()
        elif s.fast_lane_workers:
            raise SystemExit("router: fast_lane_workers needs fast_lane=haproxy (HAProxy picks each call's worker)")
        # the name this router counts under among the live routers (fleet quotas); its lane workers count under it
        self.quota_id = s.quota_router_id or uuid.uuid4().hex
        self.lane_workers: LaneWorkers | None = None  # fast_lane_workers: more router processes for the Python lane
        if s.fast_lane_workers:
            self.metrics.lane_workers_mode()
            self.lane_workers = LaneWorkers(s, self.metrics, self.quota_id)
        self.cluster = ClusterView(s.host_missing_grace_s)
        self.local = LocalLoad()
        self.keys = KeyIndex()
        self.admission = Admission()
        self.access_log = AccessLog.open(s.access_log, max_bytes=parse_bytes(s.access_log_max_bytes),
                                         backups=s.access_log_backups, on_drop=self.metrics.access_log_dropped.inc)
        self._aredis = None
        self._quota_redis = None  # fleet quotas: a client of their own, with the tight timeout
        self.tenants: TenantRegistry
        self.tenant_feed: TenantFeed | None = None
        if s.redis_url:
            import redis.asyncio as aredis

            from catalog.index import connect_redis

            sync = connect_redis(s.redis_url)
            self.tenants = RedisTenants(sync, s.tenants_prefix)
            from catalog.tenants_store import TenantStore

            self.tenant_feed = TenantFeed(RedisTenants(connect_redis(s.redis_url, timeout_s=1.0), s.tenants_prefix),
                                          TenantStore.open(s.store, s3) if s.store else None)
            self._aredis = aredis.Redis.from_url(s.redis_url, socket_timeout=2, socket_connect_timeout=2)
            self.metrics.redis_mode()
            if s.fleet_quotas:  # tenants' limits across all routers together (router/quota_policy.py)
                self._quota_redis = aredis.Redis.from_url(s.redis_url, socket_timeout=s.quota_timeout_s,
                                                          socket_connect_timeout=s.quota_timeout_s)
                self.admission = Admission(fleet=FleetQuota(
                    self._quota_redis, s.quota_prefix, self.quota_id, self.clock, self.metrics.quota_mode,
                    timeout_s=s.quota_timeout_s, router_ttl_s=s.quota_router_ttl_s))
            self.source = HeartbeatReader(self._aredis, s.heartbeat_prefix)
            catalog = open_catalog(s, s3, sync)
        else:
            if not s.tenants_file:
                raise SystemExit("embedded mode needs --tenants FILE (or use --redis URL)")
            if not s.hosts:
                raise SystemExit("embedded mode needs --hosts ADDR,ADDR (or use --redis URL)")
            self.tenants = FileTenants(s.tenants_file)
            self.source = StaticHosts(self.forwarder, s.hosts, s.poll_timeout_s)
            catalog = open_catalog(s, s3, None)
        self.directory = ModelDirectory(catalog, s.catalog_ttl_s, s.catalog_miss_ttl_s, clock=self.clock,
                                        max_unknown=s.max_unknown_names)
        self.dispatcher = Dispatcher(hosts=self.forwarder, cluster=self.cluster, local=self.local, metrics=self.metrics,
                                     clock=self.clock, max_attempts=s.max_attempts,
                                     budget=RetryBudget(s.retry_budget_ratio, s.retry_budget_cap),
                                     placement=placement_config(s), rng=random.Random(), groups=s.host_groups)
        self.servicer = RouterServicer(settings=s, keys=self.keys, directory=self.directory, cluster=self.cluster,
                                       dispatcher=self.dispatcher, metrics=self.metrics, access_log=self.access_log,
                                       clock=self.clock, wall_clock=self.wall_clock, admission=self.admission)
        self.uploads: Uploads | None = None  # tenants publish models with their API key (settings.uploads)
        if s.uploads:
            if catalog is None:
                raise SystemExit("router: uploads=true needs a store to publish to (--store, MMHOST_ROUTER_STORE)")
            try:
                self.uploads = Uploads(settings=s, authenticate=self.servicer.authenticate, repo=catalog.repo,
                                       catalog=catalog, directory=self.directory, metrics=self.metrics,
                                       clock=self.clock)
            except ValueError as e:
                raise SystemExit(f"router: uploads: {e} (settings upload_max_bytes, upload_dir)") from None
        self.health = health.aio.HealthServicer()
        self.server: aio.Server | None = None
        self.port: int | None = None
        self.health_server: aio.Server | None = None  # health_port: plaintext health alone, for kubelet probes
        self.cert_port: int | None = None  # tls_client_listen's bound port
        self.rest: RestServer | None = None  # KServe v2 REST (rest_listen), over the same servicer
        self._tasks: list[asyncio.Task] = []
        self._fast_lane_task: asyncio.Task | None = None
        self._tenants_seen: object = None
        self.metrics_http: MetricsServer | None = None

    # -- background refreshes -----------------------------------------------------------------------

    async def refresh_hosts(self) -> None:
        await self.forwarder.rotate()  # the client certificate to hostds changed on disk: new channels
        # Redis mode: whether Redis answers is a metric (mmhost_router_redis_up; alert MmhostRedisUnreachable)
        redis = self._aredis is not None
        try:
            statuses = await self.source.read()
        except Exception:
            if redis:
                self.metrics.redis_up.set(0)
            raise
        if redis:
            self.metrics.redis_up.set(1)
        self.cluster.apply(statuses, self.source.complete, self.clock())
        eligible = self.cluster.eligible()
        self.metrics.hosts_up.set(len(eligible))
        if self.dispatcher.groups:
            for group, n in hosts_per_group(eligible, self.dispatcher.groups).items():
                self.metrics.group_hosts_up.labels(group).set(n)
        self.local.sweep(self.clock(), self.settings.pending_ttl_s)
        if self.settings.hostd_data_link:  # with hostd_ca, links go with the same mutual TLS
            self.forwarder.set_data_ports({a: h.status.data_port for a, h in self.cluster.hosts.items()
                                           if h.status is not None and h.status.data_port})
        self.metrics.hostd_streams.set(self.forwarder.sweep())
        if self.source.complete:
            await self.forwarder.forget(set(self.cluster.hosts))

    async def refresh_tenants(self) -> None:
        if self.tenant_feed is not None:  # Redis mode: keeps the last known set while Redis is empty, down or slow
            await self.tenant_feed.refresh(self.clock(), self._apply_tenants)
            return
        if isinstance(self.tenants, FileTenants):
            seen = self.tenants.mtime()
            if seen == self._tenants_seen:
                return
        by_hash, limits = await asyncio.to_thread(lambda: (self.tenants.by_hash(), self.tenants.limits()))
        self._apply_tenants(by_hash, limits)
        if isinstance(self.tenants, FileTenants):
            self._tenants_seen = seen

    def _apply_tenants(self, by_hash, limits) -> None:
        self.keys.replace(by_hash)
        self.admission.replace(limits)

    async def sync_fast_lane(self) -> None:
        """HAProxy's hosts, keys and routes from the router's views: unlimited tenants only (a tenant with a rate
        or concurrency limit is admitted by this router, on the Python lane)."""
        fl = self.fastlane
        if fl is None:
            return
        try:
            if await fl.ensure_running():
                self.metrics.fast_lane_restarts.inc()
            await self._fast_lane_tls(fl)
            keys = self.keys.hashes()
            fast = frozenset(t for t in set(keys.values()) if self.admission.quota(t).unlimited)
            lanes = await self.lane_workers.lanes(fl, keys) if self.lane_workers is not None else None
            await fl.sync(self.cluster.eligible(), keys, fast, self.dispatcher.groups, lanes)
        except Exception:  # not running, or not taking its state: 0 (alert MmhostFastLaneDown); logged by _every
            self.metrics.fast_lane_up.set(0)
            raise
        self.metrics.fast_lane_up.set(1 if fl.up else 0)
        self.metrics.fast_lane_routes.set(len(fl.routes))
        self.metrics.fast_lane_syncs.inc()
        now = self.clock()
        if self.dispatcher.pcfg.hot_queue_depth > 0 or self.dispatcher.pcfg.hot_rps_per_copy > 0:
            for rk in fl.routes:  # hot models the fast lane serves get their extra copies as on the Python lane
                tenant, model, version = rk.split("/", 2)
                if not version:  # one decision per model: its latest's route
                    self.dispatcher.replicate_if_hot(tenant, model, now)
        if now >= self._dropped_read_at + DROPPED_EVERY_S:  # a runtime API call of its own: not every refresh
            self._dropped_read_at = now
            self.metrics.fast_lane_log_dropped.set(await fl.dropped_logs())

    async def _fast_lane_tls(self, fl: FastLane) -> None:
        """Rotated certificate files to HAProxy (FastLane.refresh_tls); a refusal is counted and logged, and
        never stops the sync: HAProxy serves on with the previous certificate."""
        try:
            took = await fl.refresh_tls()
        except FastLaneError as e:
            self.metrics.fast_lane_tls_reloads.labels("failed").inc()
            log.warning("fast lane: %s; it keeps the previous certificate, sent again at the next refresh", e)
            return
        if took:
            self.metrics.fast_lane_tls_reloads.labels("ok").inc(len(took))

    def _fast_records(self, recs: list[FastRecord]) -> None:
        """HAProxy's log lines, read back (router/fastlane.py): the access log lines and the request series the
        Python lane writes for the requests it serves (servicer.ModelInfer)."""
        m = self.metrics
        hosts = self.fastlane.addresses() if self.fastlane is not None else {}
        views = {v.address: v for v in self.cluster.eligible()}
        for r in recs:
            m.fast_lane_requests.inc()
            m.answered(r.tenant, r.model, r.status, r.total_ms / 1000.0)
            if not r.served and r.status in SHED_CODES and r.reason:  # HAProxy's own refusal (no host)
                m.shed.labels(r.tenant, r.model, r.reason).inc()
            host = hosts.get(r.server, r.server)
            if r.served:  # a hostd refusal: its mmhost-served says what it was
                self.access_log.write(ts=r.ts, tenant=r.tenant, model=r.model, version=r.version, host=host,
                                      total_ms=r.total_ms, status=r.status, bytes_in=r.bytes_in,
                                      bytes_out=r.bytes_out, id=r.id, reason=r.reason, served=r.served)
                continue
            version = r.version or ready_version(views.get(host), r.tenant, r.model)
            self.access_log.write(ts=r.ts, tenant=r.tenant, model=r.model, version=version, host=host,
                                  total_ms=r.total_ms, status=r.status, bytes_in=r.bytes_in, bytes_out=r.bytes_out,
                                  id=r.id, reason=r.reason,
                                  size_bytes=self.access_log.stored_sizes.get((r.tenant, r.model, version)))

    async def _every(self, what: str, fn) -> None:
        failing = False
        while True:
            await asyncio.sleep(self.settings.refresh_interval_s)
            try:
                await fn()
                failing = False
            except Exception as e:  # noqa: BLE001 - keep the last view; say so once
                self.metrics.view_refresh_errors.labels(what).inc()
                if not failing:
                    log.warning("refreshing %s failed (keeping the last view): %s", what, e)
                failing = True

    # -- lifecycle --------------------------------------------------------------------------------------

    async def start(self) -> None:
        s = self.settings
        limit = s.max_message_bytes
        self.server = aio.server(  # no interceptor: each handler is wrapped once (ground/interceptors.py)
            options=[("grpc.max_receive_message_length", limit), ("grpc.max_send_message_length", limit),
                     ("grpc.so_reuseport", 0)]
            # a client's calls past this many on one connection wait in the client: bounds the bytes one
            # connection pushes in before the byte budget (which sees a body only once it is whole) can refuse it
            + ([("grpc.max_concurrent_streams", s.max_concurrent_streams)] if s.max_concurrent_streams else [])
            + ([("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", s.stream_window_bytes)]
               if s.stream_window_bytes else []),
        )
        self.server.add_generic_rpc_handlers((self.servicer.handler(),))
        names: tuple[str, ...] = (grpc_service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name,
                                  health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME)
        if self.uploads is not None:
            self.server.add_generic_rpc_handlers((self.uploads.handler(),))
            names += (UPLOADS_SERVICE,)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection(names, self.server)
        own = "127.0.0.1:0" if s.fast_lane == "haproxy" else s.listen  # behind HAProxy: loopback only, plaintext
        self.port = tls.add_port(self.server, own, None if s.fast_lane == "haproxy" else self.creds)
        if self.port == 0:
            raise SystemExit(f"cannot listen on {own}")
        if s.fast_lane == "haproxy":
            if self.lane_workers is not None:
                try:
                    await self.lane_workers.start()
                except RuntimeError as e:
                    raise SystemExit(f"router: {e}") from None
            try:
                self.fastlane = FastLane(listen=s.listen, router=f"127.0.0.1:{self.port}", binary=s.fast_lane_binary,
                                         buffer_bytes=s.fast_lane_buffer_bytes, maxconn=s.fast_lane_maxconn,
                                         threads=s.fast_lane_threads,
                                         check_interval_s=s.fast_lane_check_interval_s,
                                         max_hosts=s.fast_lane_max_hosts, on_records=self._fast_records,
                                         listen_tls=(str(s.tls_cert), str(s.tls_key)) if self.creds else None,
                                         hostd_tls=(str(s.hostd_ca), str(s.hostd_client_cert), str(s.hostd_client_key),
                                                    s.hostd_tls_name) if s.hostd_ca else None,
                                         workers=self.lane_workers.addresses if self.lane_workers else ())
            except FastLaneError as e:
                raise SystemExit(f"router: {e}") from None
            self.internal_port, self.port = self.port, int(s.listen.rsplit(":", 1)[1])
        if self.cert_creds is not None:
            self.cert_port = tls.add_port(self.server, s.tls_client_listen, self.cert_creds)
        if s.health_port:
            # grpc's HealthServicer starts with "" SERVING: NOT_SERVING until start() is done (set at its end)
            await self.health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
            self.health_server, _ = tls.health_only_server(self.health, s.listen.rsplit(":", 1)[0], s.health_port)
            await self.health_server.start()
        for what, fn in (("hosts", self.refresh_hosts), ("tenants", self.refresh_tenants)):
            try:
                await fn()
            except Exception as e:  # noqa: BLE001 - the background loop keeps trying
                log.warning("initial %s refresh failed: %s", what, e)
            self._tasks.append(asyncio.get_running_loop().create_task(self._every(what, fn)))
        if self.admission.fleet is not None:  # counts the live routers; brings a router back from local to fleet
            await self.admission.fleet.heartbeat()
            self._tasks.append(asyncio.get_running_loop().create_task(self._every("quota", self.admission.fleet.heartbeat)))
        self._tasks.append(asyncio.get_running_loop().create_task(watch_loop_lag(self.metrics.loop_lag.observe)))
        self.access_log.start()  # its own writer thread: lines are encoded and written off the event loop
        if self.fastlane is not None:
            try:
                await self.fastlane.start()
            except FastLaneError as e:
                raise SystemExit(f"router: fast lane: {e}") from None
            await self.sync_fast_lane()
            self._fast_lane_task = asyncio.get_running_loop().create_task(self._every("fast_lane", self.sync_fast_lane))
            self._tasks.append(self._fast_lane_task)
        if s.metrics_port:
            registry = self.metrics.registry
            if self.lane_workers is not None:  # one port for the pod: the workers' series too, labelled
                lanes = self.lane_workers
                failures = self.metrics.lane_worker_metrics_failures
                registry = merged_registry(MergedCollector(
                    registry, lanes.metrics_sources, "lane_worker", on_failure=lambda i: failures.labels(i).inc()))
            self.metrics_http = serve_metrics(s.metrics_host, s.metrics_port, registry)
        await self.server.start()
        if rest_enabled(s.rest_listen):  # aiohttp on this loop: no thread or loop of its own
            self.rest = RestServer(self.servicer, s)
            await self.rest.start()
            if self.rest.ssl is not None:  # rotated certificates reach HTTPS as they reach the gRPC port
                self._tasks.append(asyncio.get_running_loop().create_task(self._every("rest_tls", self.rest.refresh_tls)))
        # As in hostd (hostd/server.py): what start-up made lives as long as the process, so it leaves the
        # collector's sight. Unfrozen, each full collection under load scanned it all: up to 39 ms of the event
        # loop, 7 times in one bench/noisy_model.py run (222 ms), a pause every call in flight then waited for.
        gc.freeze()
        await self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        await self.health.set(SERVICE, health_pb2.HealthCheckResponse.SERVING)
        mode = f"redis {s.redis_url}" if s.redis_url else f"static hosts {','.join(s.hosts)}"
        # the resolved settings, once: what an operator checks first
        if self.fastlane is not None:
            lw = self.lane_workers
            log.info("fast lane: HAProxy on %s, this router behind it on 127.0.0.1:%d%s", s.listen, self.internal_port,
                     f", {len(lw.workers)} Python-lane worker(s) on {', '.join(lw.addresses)}" if lw else "")
        log.info("router serving on %s (%s; %d host(s) up, %d tenant key(s); store %s; inflight_bytes %s, tenant %s; "
                 "max_attempts %d; uploads %s; metrics %s; event loop %s)", s.listen.rsplit(":", 1)[0] + f":{self.port}", mode,
                 len(self.cluster.eligible()), len(self.keys), s.store or "-", s.inflight_bytes,
                 s.tenant_inflight_bytes or "1/4 of it", s.max_attempts,
                 f"on (at most {s.upload_max_bytes})" if self.uploads else "off",
                 f"http://{s.metrics_host}:{s.metrics_port}/metrics" if s.metrics_port else "off",
                 eventloop.loop_kind(asyncio.get_running_loop()))

    async def stop(self) -> None:
        await self.health.enter_graceful_shutdown()
        if self._fast_lane_task is not None:  # no refresh may start HAProxy or a worker again while they stop
            self._fast_lane_task.cancel()
        if self.fastlane is not None:  # stops taking calls, finishes the ones in flight
            await self.fastlane.stop()
        if self.lane_workers is not None:
            await self.lane_workers.stop()
        if self.rest is not None:
            await self.rest.stop()
        for t in self._tasks:
            t.cancel()
        if self.server is not None:
            await self.server.stop(2.0)
        if self.health_server is not None:
            await self.health_server.stop(0.5)
        await self.dispatcher.stop()
        await self.forwarder.close()
        if self._aredis is not None:
            await self._aredis.aclose()
        if self.admission.fleet is not None and self._quota_redis is not None:
            await self.admission.fleet.leave()
            await self._quota_redis.aclose()
        self.access_log.close()
        if self.metrics_http is not None:
            self.metrics_http.close()
        log.info("router stopped")

    async def run_forever(self) -> None:
        await run_until_signal(self.start, self.stop)


def serve(settings: RouterSettings, s3: S3Settings | None = None, exit_process: bool = True) -> None:
    """Serve until SIGTERM or SIGINT, then stop. `exit_process`: end the process once stopped (exit_after), as
    `mmhost router` does; mmhost demo, which stops its hostds after its in-process router, passes False."""
    main = Router(settings, s3).run_forever()
    eventloop.run(exit_after(main) if exit_process else main, settings.event_loop)
