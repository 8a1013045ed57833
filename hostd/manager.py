"""The models of one host: catalog lookups, lifecycle, single-flight lazy loading, explicit load/unload.

A request for a model that is not resident starts its load and waits on it; concurrent requests for the
same model wait on the same load. A failed load answers every waiter with the error and leaves the model
FAILED until a backoff passes.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field

from hostd.batch_policy import BatchConfig
from hostd.batcher import ModelRunner, QueueLimits
from hostd.catalog_view import CatalogView
from hostd.cache.device import DeviceCache
from ground.errors import DeadlineExceeded, Internal, NotFound, ServingError, Unavailable
from hostd.execution import ExecutionGate
from hostd.loader import Loader, LoadResult
from hostd.metrics import HostdMetrics
from hostd.memory import release_free_memory
from hostd.model_state import ModelState, check_transition, failed_backoff
from hostd.runtimes.base import LoadedModel
from hostd.stats import ModelStats
from hostd.tenants import TenantLimitsView
from ground.manifest import ModelManifest
from ground.settings import HostdSettings
from ground.versions import VersionNotFound, resolve_version
from catalog.repository import ModelNotFound, ModelRepository

log = logging.getLogger(__name__)

Key = tuple[str, str, str]  # (tenant, model, version)


@dataclass
class ModelEntry:
    manifest: ModelManifest
    stats: ModelStats = field(default_factory=ModelStats)
    state: ModelState = ModelState.ABSENT
    runner: ModelRunner | None = None
    loaded: LoadedModel | None = None
    load_task: asyncio.Task | None = None
    unload_task: asyncio.Task | None = None
    error: str = ""
    failures: int = 0
    retry_at: float = 0.0
    memory_bytes: int = 0
    last_memory_bytes: int = 0  # measured at the previous load: the estimate for the next one
    load_cost_s: float = 0.0
    last_used: float = 0.0
    hits: int = 0
    pinned: bool = False

    @property
    def key(self) -> Key:
        return self.manifest.key()

    def set_state(self, new: ModelState) -> None:
        check_transition(self.state, new)
        self.state = new

    @property
    def busy(self) -> bool:
        return self.runner is not None and self.runner.busy


def _close(loaded: LoadedModel) -> None:
    loaded.close()
    del loaded
    release_free_memory()


class ModelManager:
    def __init__(
        self,
        *,
        repo: ModelRepository,
        loader: Loader,
        cache: DeviceCache,
        settings: HostdSettings,
        metrics: HostdMetrics,
        exec_pool: Executor,
        load_pool: Executor,
        gate: ExecutionGate | None = None,
        tenants: TenantLimitsView | None = None,
        clock: Callable[[], float] = time.monotonic,
        catalog_ttl_s: float = 2.0,
        rng: random.Random | None = None,
    ) -> None:
        self.repo = repo
        self.loader = loader
        self.cache = cache
        self.settings = settings
        self.metrics = metrics
        self._exec_pool = exec_pool
        self._load_pool = load_pool
        self.gate = gate
        self.tenants = tenants or TenantLimitsView()
        self._clock = clock
        self.catalog = CatalogView(repo, catalog_ttl_s, clock)
        self._rng = rng or random.Random()
        self.entries: dict[Key, ModelEntry] = {}
        self.device_hits = 0
        self.device_misses = 0

    # ---- catalog -----------------------------------------------------------------------------------
    async def resolve(self, tenant: str, model: str, version: str | None) -> ModelEntry:
        """The entry for the version a request gets. Unknown tenant, model or version: NotFound (the same
        message either way, so another tenant's model is indistinguishable from a missing one)."""
        item = await self.catalog.item(tenant, model)
        if not item.versions:
            raise NotFound(f"model {model!r} not found")
        try:
            v = resolve_version(item.versions, item.policy, version or None, self._rng.random())
        except VersionNotFound:
            raise NotFound(f"model {model!r} version {version!r} not found") from None
        key = (tenant, model, v)
        e = self.entries.get(key)
        if e is None:
            try:
                m = await self.catalog.manifest(tenant, model, v)
            except ModelNotFound:
                raise NotFound(f"model {model!r} version {v!r} not found") from None
            e = self.entries.setdefault(key, ModelEntry(m.resolved(self.settings.default_max_batch_size)))
        return e

    async def versions(self, tenant: str, model: str) -> list[str]:
        return list((await self.catalog.item(tenant, model)).versions)

    # ---- loading -----------------------------------------------------------------------------------
    async def ready_runner(self, e: ModelEntry, deadline: float = float("inf")) -> ModelRunner:
        while True:
            now = self._clock()
            if e.state is ModelState.READY and e.runner is not None:
                e.last_used = now
                e.hits += 1
                self.cache.access(e.key, now)
                self.metrics.cache.hits.labels("device").inc()
                self.device_hits += 1
                return e.runner
            if e.state is ModelState.FAILED and now < e.retry_at:
                wait_ms = int((e.retry_at - now) * 1000)
                raise Unavailable(
                    f"model {e.manifest.model!r} version {e.manifest.version!r} failed to load: {e.error} "
                    f"(next attempt in {wait_ms} ms)",
                    reason="load_failed",
                    retry_after_ms=max(wait_ms, 1),
                )
            if e.state is not ModelState.LOADING:
                self.metrics.cache.misses.labels("device").inc()
                self.device_misses += 1
            task = e.unload_task if e.state is ModelState.UNLOADING else self._start_load(e)
            remaining = deadline - now
            if remaining <= 0:
                raise DeadlineExceeded(f"deadline passed while model {e.manifest.model!r} was loading", reason="deadline")
            try:
                await asyncio.wait_for(asyncio.shield(task), None if remaining == float("inf") else remaining)
            except asyncio.TimeoutError:
                raise DeadlineExceeded(
                    f"deadline passed while model {e.manifest.model!r} was loading", reason="deadline"
                ) from None

    def _start_load(self, e: ModelEntry) -> asyncio.Task:
        if e.load_task is None:
            e.set_state(ModelState.LOADING)
            e.load_task = asyncio.get_running_loop().create_task(self._load(e))
            e.load_task.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved by waiters
        return e.load_task

    def _refresh_cache_flags(self) -> None:
        def busy(key) -> bool:
            x = self.entries.get(key)
            return x is None or x.state is not ModelState.READY or x.busy

        self.cache.refresh(busy, lambda key: key in self.entries and self.entries[key].pinned)

    async def _make_room(self, e: ModelEntry) -> None:
        """Reserve device memory for a load, evicting by policy first; refuse the load when nothing can
        be evicted (everything busy, pinned, or protected by its tenant's share)."""
        m = e.manifest
        estimate = e.last_memory_bytes or m.total_bytes
        self._refresh_cache_flags()
        plan = self.cache.reserve(e.key, m.tenant, estimate, self._clock())
        if not plan.ok:
            self.metrics.cache.load_refused.labels(m.tenant, m.model).inc()
            raise Unavailable(
                f"no device memory for model {m.model!r} version {m.version!r}: {plan.reason}",
                reason="no_capacity", retry_after_ms=500,
            )
        for key in plan.evict:
            victim = self.entries.get(key)
            if victim is not None:
                await self.unload(victim, reason="capacity")

    async def enforce_watermark(self, measured_used: int | None = None) -> int:
        """Evict (best effort) once measured use passes the high watermark, down to the low one."""
        self._refresh_cache_flags()
        plan = self.cache.watermark_plan(self._clock(), measured_used)
        for key in plan.evict:
            victim = self.entries.get(key)
            if victim is not None:
                await self.unload(victim, reason="watermark")
        return len(plan.evict)

    def _tier_metrics(self) -> None:
        c = self.metrics.cache
        c.bytes.labels("device").set(self.cache.used)
        c.bytes.labels("disk").set(self.loader.disk.used)
        if self.loader.ram is not None:
            c.bytes.labels("ram").set(self.loader.ram.used)
        for tenant, n in self.cache.tenant_bytes().items():
            c.tenant_bytes.labels(tenant).set(n)

    async def _load(self, e: ModelEntry) -> None:
        m = e.manifest
        estimate = e.last_memory_bytes or m.total_bytes
        try:
            await self._make_room(e)
            res = await asyncio.get_running_loop().run_in_executor(self._load_pool, self.loader.load, m)
        except Unavailable as err:
            self.cache.release(e.key)
            if err.reason != "no_capacity":
                self._failed(e, err)
                raise
            e.set_state(ModelState.ABSENT)  # nothing wrong with the model: no room right now, try again later
            raise
        except Exception as err:  # noqa: BLE001 - every failure marks the model FAILED, then reaches waiters
            self.cache.release(e.key)
            self._failed(e, err)
            if isinstance(err, ServingError):
                raise
            raise Internal(f"model {m.model!r} version {m.version!r}: load failed: {e.error}") from err
        finally:
            e.load_task = None
        self._loaded(e, res)
        if res.source_tier != "ram" and self.loader.ram is not None:
            fill = asyncio.get_running_loop().run_in_executor(self._load_pool, self.loader.remember, m)
            fill.add_done_callback(lambda f: f.cancelled() or f.exception() and log.warning("RAM tier fill: %s", f.exception()))
        if e.memory_bytes > estimate:  # measured more than was reserved: back under the watermarks
            await self.enforce_watermark()

    def _failed(self, e: ModelEntry, err: Exception) -> None:
        m = e.manifest
        e.failures += 1
        e.error = err.message if isinstance(err, ServingError) else f"{type(err).__name__}: {err}"
        e.retry_at = self._clock() + failed_backoff(e.failures, self.settings.failed_backoff_s)
        e.set_state(ModelState.FAILED)
        self.metrics.loads.labels(m.tenant, m.model, "failure").inc()
        log.error("load of %s/%s v%s failed: %s", m.tenant, m.model, m.version, e.error)

    def _loaded(self, e: ModelEntry, res: LoadResult) -> None:
        m = e.manifest
        labels = (m.tenant, m.model)
        for phase, secs in res.timings.items():
            self.metrics.load_duration.labels(phase).observe(secs)
        self._count_tiers(res.source_tier)
        e.loaded = res.model
        # The probe's reading when plausible; otherwise (RSS on CPU can miss memory the allocator reused)
        # the larger of the file size and the last plausible measurement of this model.
        e.memory_bytes = res.memory_delta if res.memory_plausible else max(m.total_bytes, e.last_memory_bytes)
        if res.memory_plausible:
            e.last_memory_bytes = res.memory_delta
        # what a reload would cost: from the RAM tier only deserialize + warm-up, else the whole load
        e.load_cost_s = (res.timings["deserialize"] + res.timings["warmup"]) if self.loader.ram is not None else sum(res.timings.values())
        b = m.batching
        e.runner = ModelRunner(
            tenant=m.tenant,
            model=m.model,
            loaded=res.model,
            config=BatchConfig(
                max_batch_size=m.max_batch_size or 0,
                max_queue_delay=b.max_queue_delay_us / 1e6,
                preferred_sizes=tuple(b.preferred_batch_sizes),
            ),
            limits=QueueLimits(
                max_queue_size=m.queue_policy.max_queue_size or self.settings.max_queue_size,
                default_timeout_s=m.queue_policy.default_timeout_us / 1e6,
                delay_on_timeout=m.queue_policy.timeout_action == "delay",
            ),
            # per-tenant instance groups: the tenant's tier decides how many executors its models get
            instances=self.tenants.get(m.tenant).instances or m.instance_count,
            pool=self._exec_pool,
            stats=e.stats,
            metrics=self.metrics,
            gate=self.gate,
            clock=self._clock,
        )
        e.failures = 0
        e.error = ""
        e.last_used = self._clock()
        e.set_state(ModelState.READY)
        self.cache.loaded(e.key, e.memory_bytes, e.load_cost_s, e.last_used)
        self.metrics.loads.labels(*labels, "success").inc()
        self.metrics.model_memory.labels(m.tenant, m.model, m.version).set(e.memory_bytes)
        self._update_resident()
        self._tier_metrics()
        log.info(
            "loaded %s/%s v%s from %s: %.1f MB%s in %.2fs",
            m.tenant, m.model, m.version, res.source_tier, e.memory_bytes / 1e6,
            "" if res.memory_plausible else f" (probe saw {res.memory_delta / 1e6:.1f} MB; using the larger estimate)",
            sum(res.timings.values()),
        )

    async def load(self, tenant: str, model: str, version: str | None = None, pin: bool | None = None) -> ModelEntry:
        e = await self.resolve(tenant, model, version)
        if pin is not None:
            e.pinned = pin
        if e.state is ModelState.FAILED:
            e.retry_at = 0.0  # an explicit load retries at once
        await self.ready_runner(e)
        return e

    def _count_tiers(self, source: str) -> None:
        c = self.metrics.cache
        if self.loader.ram is not None:
            (c.hits if source == "ram" else c.misses).labels("ram").inc()
        if source != "ram":
            (c.hits if source == "disk" else c.misses).labels("disk").inc()

    async def unload(self, e: ModelEntry, drain_timeout_s: float = 30.0, reason: str = "explicit") -> None:
        if e.state is ModelState.LOADING and e.load_task is not None:
            try:
                await asyncio.shield(e.load_task)
            except Exception:  # noqa: BLE001 - a failed load leaves nothing to unload
                pass
        if e.state is ModelState.FAILED:
            e.set_state(ModelState.ABSENT)
            return
        if e.state is ModelState.UNLOADING and e.unload_task is not None:
            await asyncio.shield(e.unload_task)
            return
        if e.state is not ModelState.READY:
            return
        e.set_state(ModelState.UNLOADING)
        self.metrics.cache.evictions.labels("device", reason).inc()
        e.unload_task = asyncio.get_running_loop().create_task(self._unload(e, drain_timeout_s))
        await asyncio.shield(e.unload_task)

    async def _unload(self, e: ModelEntry, drain_timeout_s: float) -> None:
        runner, loaded = e.runner, e.loaded
        try:
            if runner is not None:
                if runner.busy:
                    try:
                        await asyncio.wait_for(runner.wait_idle(), drain_timeout_s)
                    except asyncio.TimeoutError:
                        log.warning("unload of %s: work still queued after %.0fs; failing it", e.key, drain_timeout_s)
                runner.close()
            if loaded is not None:
                await asyncio.get_running_loop().run_in_executor(self._load_pool, _close, loaded)
        finally:
            e.runner = None
            e.loaded = None
            m = e.manifest
            if e.memory_bytes:
                self.metrics.model_memory.remove(m.tenant, m.model, m.version)
            e.memory_bytes = 0
            e.unload_task = None
            self.cache.release(e.key)
            e.set_state(ModelState.ABSENT)
            self._update_resident()
            self._tier_metrics()

    async def unload_model(self, tenant: str, model: str) -> int:
        """Unload every resident version of a model; returns how many were unloaded."""
        targets = [e for (t, mname, _), e in self.entries.items() if t == tenant and mname == model]
        if not targets and not (await self.catalog.item(tenant, model)).versions:
            raise NotFound(f"model {model!r} not found")
        n = 0
        for e in targets:
            if e.state in (ModelState.READY, ModelState.LOADING, ModelState.FAILED):
                await self.unload(e)
                n += 1
            e.pinned = False
        return n

    def _update_resident(self) -> None:
        self.metrics.models_resident.set(sum(1 for e in self.entries.values() if e.state is ModelState.READY))

    async def preload_all(self) -> None:
        manifests = await asyncio.to_thread(self.repo.all_manifests)
        for m in manifests:
            try:
                await self.load(m.tenant, m.model, m.version)
            except ServingError as err:
                log.error("preload of %s/%s v%s failed: %s", m.tenant, m.model, m.version, err.message)

    async def catalog_models(self, tenant: str) -> list[tuple[str, list[str]]]:
        return await self.catalog.models(tenant)

    async def wait_idle(self, timeout_s: float) -> bool:
        runners = [e.runner for e in self.entries.values() if e.runner is not None]
        if not runners:
            return True
        try:
            await asyncio.wait_for(asyncio.gather(*(r.wait_idle() for r in runners)), timeout_s)
            return True
        except asyncio.TimeoutError:
            return False

    async def close(self) -> None:
        for e in list(self.entries.values()):
            if e.state in (ModelState.READY, ModelState.LOADING):
                await self.unload(e, drain_timeout_s=0.0, reason="shutdown")
