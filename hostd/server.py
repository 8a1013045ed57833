"""hostd's composition root: settings in, a running server out. Wires storage, loader, manager, servicers,
health, reflection and metrics; SIGTERM drains in-flight requests, then exits."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import logging
import shutil
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NoReturn

import psutil
from grpc import aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from ground.cpus import usable_cpus
from ground.loopidle import LoopIdle, idle_loop_factory
from ground.looplag import watch_loop_lag
from ground.metrics_http import serve_metrics

from hostd.core.device import DeviceCache
from hostd.cache.policy import Share
from hostd.cache.tiers import DiskTier, RamTier
from hostd.control import ControlServicer, HostCounters, host_status
from hostd.execution import ExecutionGate
from hostd import tenants as tenant_limits
from ground.settings import HeartbeatSettings
from hostd.heartbeat import Heartbeat
from ground import eventloop, link_tls, tls
from ground.interceptors import ErrorInterceptor
from hostd import forwarded, wire_request
from hostd.data_port import DataPort
from hostd.loader import Loader
from hostd.manager import ModelManager
from hostd.memory import cuda_available, select_probe
from hostd.metrics import HostdMetrics
from hostd.runtimes.base import DeviceSpec
from hostd.core.sizing import WIDE_MAX_S, ExecutionPlan, plan_execution
from hostd.runtimes.registry import prepare_runtime
from hostd.servicer import InferenceServicer
from ground.manifest import ModelFormat
from ground.serving import exit_after, run_until_signal
from ground.settings import HostdSettings, S3Settings
from ground.units import parse_bytes
from ground.wire import SERVICE
from protos import grpc_service_pb2, grpc_service_pb2_grpc, hostd_control_pb2, hostd_control_pb2_grpc
from storage_adapters import open_storage
from catalog.repository import ModelRepository

log = logging.getLogger(__name__)
LOAD_WORKERS = 4  # load threads: loads, unloads and RAM-tier fills at once (the simulator models the same pool)


def pick_device(settings: HostdSettings) -> tuple[DeviceSpec, ExecutionPlan]:
    """The device and the execution plan on it (the plan read once: it reads the cgroup's CPU limit)."""
    kind = settings.device
    if kind == "auto":
        kind = "cuda" if cuda_available() else "cpu"
    plan = execution_plan(settings, kind)
    # the plan's threads: the settings, lowered when slots x threads would oversubscribe the cores
    return DeviceSpec(kind=kind, ort_intra_op_threads=plan.threads, ort_spinning=settings.ort_spinning,
                      torch_threads=plan.threads, ort_wide_threads=plan.wide,
                      ort_wide_prepacked=settings.wide_prepacked), plan


def lower_thread_priority(nice: int) -> None:
    """This thread's nice value (Linux sets it per thread; elsewhere it would be the process's: skipped)."""
    if sys.platform.startswith("linux"):
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
        except OSError:  # not permitted here: same priority as the loop
            log.debug("could not lower a model thread's priority", exc_info=True)


def set_switch_interval(seconds: float) -> None:
    """The interpreter's switch interval for this process (0: leave Python's default). A thread that wants the
    GIL waits up to this long before asking the holder to drop it: a batch thread that finished or is about to
    start a batch (it merges and splits the batch's arrays under the GIL) waits that long while the event loop is
    busy, and the model's executor idles meanwhile (docs/execution.md item 12). Process-wide, so only the
    process's own entry (`serve`) sets it, not a Hostd embedded in another program."""
    if seconds > 0:
        sys.setswitchinterval(seconds)


def execution_plan(settings: HostdSettings, kind: str) -> ExecutionPlan:
    """Slots and runtime threads: slots x threads <= cores on CPU (hostd/core/sizing.py); cores = the CPUs this
    process may use, its affinity lowered to its cgroup's CPU limit (ground/cpus.py), not the machine's count."""
    threads = settings.ort_intra_op_threads or settings.torch_threads
    return plan_execution(usable_cpus(), kind, settings.execution_slots, threads, settings.wide_lone_batches)


class Hostd:
    def __init__(self, settings: HostdSettings, s3: S3Settings | None = None,
                 heartbeat: HeartbeatSettings | None = None) -> None:
        self.settings = settings
        self.metrics = HostdMetrics()
        self.device, plan = pick_device(settings)
        self.probe = select_probe(self.device.kind, self.device.index)
        self.storage = open_storage(settings.store, s3)
        self.repo = ModelRepository(self.storage)
        # model threads below the event loop (compute_nice); ORT's own pool threads inherit the loader's value
        nice = (lambda: lower_thread_priority(settings.compute_nice)) if settings.compute_nice else None
        # one batch thread per execution slot, and one to hand over to while a finished batch's thread returns:
        # batches never run more at once (the gate's slots bound them; a wide batch borrows slots, one thread).
        # Was 32: the pool started threads on the event loop as it went, and handed batches round threads gone
        # cold; bench/noisy_model.py --direct-only, 32 against 3 interleaved (two pairs, 7 s phases): light p99
        # beside the noisy model 12.8/12.7 and 16.2/14.4 ms against 9.5/12.0 and 9.1/10.8, noisy kept 0.85-0.95
        # against 0.88-0.96; bench/batching.py c32 1,391 against 1,374 req/s (the same within noise)
        self.exec_pool = ThreadPoolExecutor(max_workers=plan.slots + 1, thread_name_prefix="exec", initializer=nice)
        self.load_pool = ThreadPoolExecutor(max_workers=LOAD_WORKERS, thread_name_prefix="load", initializer=nice)
        self.metrics.load_workers.set(LOAD_WORKERS)
        self.budget = parse_bytes(settings.device_memory, self.probe.total())
        ram_budget = parse_bytes(settings.ram_cache_bytes, psutil.virtual_memory().total)
        self.ram = RamTier(ram_budget) if ram_budget > 0 else None
        self.disk = DiskTier(settings.cache_dir, parse_bytes(settings.disk_cache_bytes))
        self.tenants = tenant_limits.TenantLimitsView(
            tenant_limits.load_limits_file(settings.tenant_limits) if settings.tenant_limits else None)
        self.env_shares = parse_shares(settings.tenant_shares, self.budget)  # read once; the registry wins
        self._overridden: list[str] = []
        self.cache = DeviceCache(
            self.budget, settings.high_watermark, settings.low_watermark, settings.eviction_policy, self._shares(),
        )
        # tenant limits re-read from the registry (Redis mode) or the tenants file (embedded mode)
        self.tenant_source = (tenant_limits.RedisLimits(heartbeat.redis_url, settings.tenants_prefix)
                              if heartbeat is not None and heartbeat.redis_url
                              else tenant_limits.FileLimits(settings.tenant_limits) if settings.tenant_limits else None)
        # fed by the selector of the loop `serve` runs (ground/loopidle.py); on any other loop it stays quiet
        self.loop_idle = LoopIdle()
        if plan.note:
            log.warning("execution: %s", plan.note)
        self.metrics.execution_slots.set(plan.slots)
        self.gate = ExecutionGate(
            plan.slots, self.tenants.weight,
            on_wait=lambda tenant, s: self.metrics.slot_wait.labels(tenant).observe(s),
            per_model=settings.execution_slots_per_model, unit=settings.fair_unit,
            wide_max_s=WIDE_MAX_S if plan.wide else 0.0,
            loop_idle=self.loop_idle if plan.wide and settings.idle_loop_lone_batches else None,
            continues=settings.worker_continues_batches,
        )
        # the disk tier's writes and saved graphs run in the background at the lowest priority: on a busy
        # host they wait, rather than slow the loads and requests that follow a cold load
        self.tier_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tier-write",
                                            initializer=lambda: lower_thread_priority(19))
        self.loader = Loader(self.storage, self.disk, self.ram, self.device, self.probe, background=self.tier_pool,
                             upgrades=self.load_pool,
                             on_phase=lambda phase, s: self.metrics.load_duration.labels(phase).observe(s))
        self.manager = ModelManager(
            repo=self.repo, loader=self.loader, cache=self.cache, settings=settings, metrics=self.metrics,
            exec_pool=self.exec_pool, load_pool=self.load_pool, gate=self.gate, tenants=self.tenants,
        )
        c = self.metrics.cache
        c.budget.labels("device").set(self.budget)
        c.budget.labels("disk").set(self.disk.budget)
        c.budget.labels("ram").set(ram_budget)
        # bytes per tier from the start (the disk tier adopts what it finds on disk), not from the first load:
        # alerts that compare them with budgets and free space must see every host
        c.bytes.labels("device").set(0)
        c.bytes.labels("disk").set(self.disk.used)
        if self.ram is not None:
            c.bytes.labels("ram").set(0)
        c.watermark.labels("high").set(self.budget * settings.high_watermark)
        c.watermark.labels("low").set(self.budget * settings.low_watermark)
        self._disk_gauges(filesystem_bytes(self.disk.root))
        self._tasks: list[asyncio.Task] = []
        self.started = time.monotonic()
        self.draining = False
        self.host_id = f"{socket.gethostname()}:{settings.listen.rsplit(':', 1)[-1]}"
        self.server: aio.Server | None = None
        self.health = health.aio.HealthServicer() if hasattr(health, "aio") else health.HealthServicer()
        self.port: int | None = None
        self.health_server: aio.Server | None = None  # health_port: plaintext health alone, for kubelet probes
        self.data_port: DataPort | None = None  # routers' calls on the data link (hostd/data_port.py)
        self.heartbeat = Heartbeat(self.status, heartbeat) if heartbeat is not None and heartbeat.redis_url else None

    def status(self):
        counters = HostCounters(self.servicer.requests_by_tenant, self.servicer.shed_by_tenant,
                                self.manager.device_hits, self.manager.device_misses)
        return host_status(self.host_id, self.settings.listen, self.manager, self.probe, self.budget, self.started,
                           self.draining, self.device.name, counters, self.gate, self.settings.host_group,
                           self.data_port.port if self.data_port is not None else 0)

    def _shares(self) -> dict[str, Share]:
        """Device shares: the registry's (live: `mmhost tenant set-limits`) over the environment's
        (MMHOST_HOSTD_TENANT_SHARES); an overridden environment share is logged on each change and counted."""
        shares, overridden = tenant_limits.merge_shares(self.tenants.shares(self.budget), self.env_shares)
        if overridden != self._overridden:
            if overridden:
                log.warning("tenant registry shares override MMHOST_HOSTD_TENANT_SHARES for %s (the registry wins; "
                            "drop them from the environment or change them with `mmhost tenant set-limits`)",
                            ", ".join(overridden))
            else:
                log.info("no tenant registry share overrides MMHOST_HOSTD_TENANT_SHARES now")
            self._overridden = overridden
        self.metrics.env_shares_overridden.set(len(overridden))
        return shares

    def apply_limits(self, limits) -> None:
        self.tenants.replace(limits)
        self.cache.shares = self._shares()

    def _disk_gauges(self, disk: tuple[int, int] | None) -> None:
        """The disk tier's filesystem: free bytes and size (filesystem_bytes; None: left as they were)."""
        if disk is not None:
            self.metrics.cache.disk_free.set(disk[0])
            self.metrics.cache.disk_capacity.set(disk[1])

    async def _pressure_loop(self, interval_s: float = 1.0) -> None:
        """Device gauges, and watermark eviction from the probe's reading (NVML sees everything on the GPU,
        including memory the per-model measurements missed)."""
        c = self.metrics.cache
        gpu = self.device.kind == "cuda"
        while True:
            try:
                used, disk = await asyncio.to_thread(lambda: (self.probe.used(), filesystem_bytes(self.disk.root)))
                self._disk_gauges(disk)
                c.device_used.set(used)
                c.device_total.set(self.probe.total())
                util = self.probe.utilization()
                if util is not None:
                    c.device_util.set(util)
                await self.manager.enforce_watermark(used if gpu else None)
            except Exception:  # noqa: BLE001 - a failed probe read must not stop the loop
                log.exception("memory pressure check failed")
            await asyncio.sleep(interval_s)

    async def start(self) -> None:
        s = self.settings
        try:  # before anything slow: no certificates and no plaintext=true, or unusable files, and it stops here
            creds = tls.hostd_credentials(s)
        except (OSError, ValueError) as e:  # TLSConfigError is a ValueError
            msg = str(e) if str(e).startswith("hostd:") else f"hostd: {e}"
            raise SystemExit(f"{msg} (settings tls_cert, tls_key, tls_client_ca, plaintext, tls_without_client_auth; "
                             "env MMHOST_HOSTD_*)") from None
        # ONNX Runtime's one-time start-up (thread pools, arenas) now, not inside the first cold load.
        # torch is primed on its first model only: hostd stays small until a torch model is asked for.
        await asyncio.get_running_loop().run_in_executor(
            self.load_pool, prepare_runtime, ModelFormat.ONNX, self.device
        )
        limit = s.max_request_bytes + (1 << 20)
        self.server = aio.server(
            # the router-certificate check first: nothing reads mmhost-tenant before it passed
            interceptors=[*tls.hostd_interceptors(s), ErrorInterceptor(wire_request.DECODERS)],
            options=[("grpc.max_receive_message_length", limit), ("grpc.max_send_message_length", limit),
                     ("grpc.so_reuseport", 0)],
        )
        self.servicer = InferenceServicer(self.manager, self.metrics, s.default_tenant if s.dev_mode else None)
        grpc_service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(self.servicer, self.server)
        hostd_control_pb2_grpc.add_HostdControlServicer_to_server(ControlServicer(self.status), self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        # routers' ModelInfer calls, many to a stream (raw frames: ground/forwarded.py)
        self.server.add_generic_rpc_handlers((forwarded.handler(self.servicer.plane, self.servicer.default_tenant,
                                                                limit),))
        names = (
            grpc_service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name,
            hostd_control_pb2.DESCRIPTOR.services_by_name["HostdControl"].full_name,
            forwarded.SERVICE_NAME,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection.SERVICE_NAME,
        )
        reflection.enable_server_reflection(names, self.server)
        self.port = tls.add_port(self.server, s.listen, creds)
        if self.port == 0:
            raise SystemExit(f"cannot listen on {s.listen}")
        # the link serves the gRPC port's TLS (ground/link_tls.py: None exactly when creds is), which takes
        # Python 3.11; without it a TLS hostd opens no link rather than a plaintext one
        if s.data_port >= 0 and (creds is None or link_tls.SERVER_SUPPORTED):
            self.data_port = DataPort(self.servicer.plane, self.servicer.default_tenant, limit,
                                      link_tls.hostd_link_tls(s))
            try:
                await self.data_port.start(s.listen.rsplit(":", 1)[0].strip("[]"), s.data_port)
            except OSError as e:
                raise SystemExit(f"cannot open the data port {s.data_port}: {e}") from None
        self.metrics.watch(lambda: list(self.manager.entries.items()), self.probe)  # Triton's nv_* series
        if s.metrics_port:
            serve_metrics(s.metrics_host, s.metrics_port, self.metrics.registry)  # /metrics only; daemon thread
        # Not ready until preloading (if any) is done: the health servicer answers SERVING for "" by default.
        await self.health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.health.set(SERVICE, health_pb2.HealthCheckResponse.NOT_SERVING)
        if s.health_port:
            self.health_server, _ = tls.health_only_server(self.health, s.listen.rsplit(":", 1)[0], s.health_port)
            await self.health_server.start()
        await self.server.start()
        self._tasks.append(asyncio.get_running_loop().create_task(self._pressure_loop()))
        self._tasks.append(asyncio.get_running_loop().create_task(watch_loop_lag(self.metrics.loop_lag.observe)))
        if self.tenant_source is not None:
            try:
                await tenant_limits.refresh_once(self.tenant_source, self.apply_limits)
            except Exception as e:  # noqa: BLE001 - the loop keeps trying
                log.warning("initial tenant limits read failed: %s", e)
            self._tasks.append(asyncio.get_running_loop().create_task(
                tenant_limits.refresh_loop(self.tenant_source, self.apply_limits, s.tenants_refresh_s)))
        if s.preload:
            await self.manager.preload_all()
        # Everything made so far (modules, runtimes, servicers) lives as long as the process: out of the
        # collector's sight, a full collection under load costs microseconds instead of ~15 ms of the loop
        # (measured: 56k objects after start on the 2-core bench machine), a pause every request then waited for.
        gc.freeze()
        self.servicer.started = True
        await self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        await self.health.set(SERVICE, health_pb2.HealthCheckResponse.SERVING)
        if self.heartbeat is not None:  # routers find this host only once it serves
            self.heartbeat.start()
        loop = eventloop.loop_kind(asyncio.get_running_loop())
        log.info("hostd serving on %s (device %s, probe %s, store %s; device budget %d bytes (%s), watermarks "
                 "%.2f/%.2f, eviction %s; ram tier %s, disk tier %d bytes; %s; data port %s; metrics %s; event loop %s)",
                 s.listen.rsplit(":", 1)[0] + f":{self.port}", self.device.name, self.probe.name,
                 self.storage.description, self.budget, s.device_memory, s.high_watermark, s.low_watermark,
                 s.eviction_policy, self.ram.budget if self.ram else "off", self.disk.budget,
                 "redis mode (heartbeats)" if self.heartbeat is not None else "embedded mode (routers poll)",
                 self.data_port.port if self.data_port is not None else "off",
                 f"http://{s.metrics_host}:{s.metrics_port}/metrics" if s.metrics_port else "off", loop)
        if loop == "uvloop" and s.idle_loop_lone_batches:
            log.info("event loop uvloop: lone batches run on worker threads only (its waits are not timed; "
                     "ground/eventloop.py)")

    async def drain_and_stop(self) -> None:
        """Stop taking new requests (health NOT_SERVING, ServerReady false), finish in-flight ones within the
        drain timeout, then stop."""
        if self.draining:
            return
        self.draining = True
        self.servicer.draining = True  # new inference requests get UNAVAILABLE (a router retries elsewhere)
        self.metrics.draining.set(1)
        if self.heartbeat is not None:  # routers drop this host now; in-flight requests still finish
            await self.heartbeat.stop()
        await self.health.enter_graceful_shutdown()
        log.info("draining: %d requests in flight, waiting up to %.0fs", self.servicer.inflight, self.settings.drain_timeout_s)
        if not await self.servicer.wait_quiet(self.settings.drain_timeout_s):
            log.warning("drain timeout: %d requests still in flight are cancelled", self.servicer.inflight)
        # Late arrivals (a router that has not yet seen us leave) get UNAVAILABLE, which it retries
        # elsewhere, rather than a connection reset.
        await asyncio.sleep(self.settings.drain_linger_s)
        assert self.server is not None
        await self.server.stop(0.5)
        if self.data_port is not None:
            await self.data_port.close()
        if self.health_server is not None:
            await self.health_server.stop(0.5)
        for t in self._tasks:
            t.cancel()
        if isinstance(self.tenant_source, tenant_limits.RedisLimits):
            await self.tenant_source.close()
        await self.manager.close()
        self.exec_pool.shutdown(wait=False, cancel_futures=True)
        self.load_pool.shutdown(wait=False, cancel_futures=True)
        self.tier_pool.shutdown(wait=False, cancel_futures=True)
        log.info("hostd stopped")

    async def run_forever(self) -> None:
        await run_until_signal(self.start, self.drain_and_stop)


def filesystem_bytes(path) -> tuple[int, int] | None:
    """(free bytes for unprivileged writers, size) of the filesystem holding `path` (or its nearest existing
    parent: the disk tier's folder appears with its first model); None when unreadable."""
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        usage = shutil.disk_usage(p)
    except OSError:
        return None
    return usage.free, usage.total


def parse_shares(text: str, budget: int) -> dict[str, Share]:
    """'{"t": {"guaranteed": "25%", "maximum": "1GiB"}}' -> bytes of the device budget."""
    if not text.strip():
        return {}
    raw = json.loads(text)
    return {
        tenant: Share(
            guaranteed=parse_bytes(str(v.get("guaranteed", 0)), budget),
            maximum=parse_bytes(str(v["maximum"]), budget) if v.get("maximum") is not None else None,
        )
        for tenant, v in raw.items()
    }


def serve(settings: HostdSettings, s3: S3Settings | None = None, heartbeat: HeartbeatSettings | None = None) -> NoReturn:
    """Serve until SIGTERM or SIGINT, drain, and end the process (`mmhost hostd`'s own): exit_after."""
    set_switch_interval(settings.switch_interval_s)
    hostd = Hostd(settings, s3, heartbeat)
    eventloop.run(exit_after(hostd.run_forever()), settings.event_loop, idle_loop_factory(hostd.loop_idle))
