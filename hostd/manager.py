"""The models of one host: catalog lookups, each version's lifecycle (single-flight lazy loading, backoff
after a failed load, explicit load/unload) as the asyncio shell over the core's Lifecycle and DeviceCache.

A request for a model that is not resident starts its load and waits on it; concurrent requests for the
same model wait on the same load. A failed load answers every waiter with the error and leaves the model
FAILED until a backoff passes. Eviction is carried out by hostd/eviction.py, metrics by hostd/model_metrics.py.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from concurrent.futures import Executor

from catalog.repository import ModelNotFound, ModelRepository
from ground.errors import DeadlineExceeded, NotFound, ServingError, Unavailable, shown
from ground.settings import HostdSettings
from ground.versions import VersionNotFound, resolve_version
from hostd.batch_policy import BatchConfig
from hostd.batcher import ModelRunner, QueueLimits
from hostd.catalog_view import CatalogView
from hostd.core.device import DeviceCache
from hostd.core.lifecycle import Action, ModelState
from hostd.core.residency import Residency
from hostd.entry import Key, ModelEntry
from hostd.eviction import Evictor
from hostd.execution import ExecutionGate
from hostd.loader import Loader, LoadProgress, LoadResult
from hostd.memory import release_free_memory
from hostd.metrics import HostdMetrics
from hostd.model_metrics import ModelMetrics
from hostd.runtimes.base import LoadedModel
from hostd.tenants import TenantLimitsView

log = logging.getLogger(__name__)

__all__ = ["Key", "ModelEntry", "ModelManager"]


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
        self.catalog = CatalogView(repo, catalog_ttl_s, clock, is_resident=self._resident)
        self._rng = rng or random.Random()
        self.entries: dict[Key, ModelEntry] = {}
        self.device_hits = 0
        self.device_misses = 0
        self.residency = Residency(cache, settings.failed_backoff_s)
        self._metrics = ModelMetrics(metrics, cache, loader)
        self.evictor = Evictor(self.residency, self.entries, lambda e, reason: self.unload(e, reason=reason),
                               self._metrics, clock)

    # ---- catalog -----------------------------------------------------------------------------------
    async def resolve(self, tenant: str, model: str, version: str | None) -> ModelEntry:
        """The entry for the version a request gets. Unknown tenant, model or version: NotFound (the same
        message either way, so another tenant's model is indistinguishable from a missing one)."""
        item = await self.catalog.item(tenant, model)
        if not item.versions:
            raise NotFound(f"model {shown(model)} not found")
        try:
            v = resolve_version(item.versions, item.policy, version or None, self._rng.random())
        except VersionNotFound:
            item = await self.catalog.recheck(tenant, model)  # published since the listing was cached?
            try:
                v = resolve_version(item.versions, item.policy, version or None, self._rng.random())
            except VersionNotFound:
                raise NotFound(f"model {shown(model)} version {shown(version or '')} not found") from None
        key = (tenant, model, v)
        e = self.entries.get(key)
        if e is None:
            try:
                m = await self.catalog.manifest(tenant, model, v)
            except ModelNotFound:
                raise NotFound(f"model {shown(model)} version {shown(v)} not found") from None
            e = self.entries.setdefault(key, ModelEntry(
                m.resolved(self.settings.default_max_batch_size), self.residency.life(key)))
        return e

    async def versions(self, tenant: str, model: str) -> list[str]:
        return list((await self.catalog.item(tenant, model)).versions)

    async def catalog_models(self, tenant: str) -> list[tuple[str, list[str]]]:
        return await self.catalog.models(tenant)

    # ---- loading -----------------------------------------------------------------------------------
    async def ready_runner(self, e: ModelEntry, deadline: float = float("inf")) -> ModelRunner:
        while True:
            now = self._clock()
            action = self.residency.want(e.key, now)
            if action is Action.SERVE and e.runner is not None:
                e.last_used = now
                e.hits += 1
                self._metrics.device_lookup(hit=True)
                self.device_hits += 1
                return e.runner
            if action is Action.BACKOFF:
                raise self._backoff_error(e, now)
            if action in (Action.START_LOAD, Action.WAIT_UNLOAD):
                self._metrics.device_lookup(hit=False)
                self.device_misses += 1
            if action is Action.START_LOAD:
                task = self._start_load(e)
            else:
                task = e.unload_task if action is Action.WAIT_UNLOAD else e.load_task
            if task is None:  # between a state change and its task (cannot happen today): look again
                await asyncio.sleep(0)
                continue
            remaining = deadline - now
            if remaining <= 0:
                raise DeadlineExceeded(f"deadline passed while model {e.manifest.model!r} was loading", reason="deadline")
            # wait in slices no longer than the stall bound, so that storage that stops sending is noticed
            stall = self.settings.storage_stall_s
            try:
                await asyncio.wait_for(asyncio.shield(task), min(remaining, stall))
            except asyncio.TimeoutError:
                progress = e.load_progress
                if progress is not None and progress.stalled(self._clock(), stall):
                    raise Unavailable(
                        f"model {shown(e.manifest.model)}: model storage is not answering; retry later",
                        reason="storage_down", retry_after_ms=int(stall * 1000),
                    ) from None
                if self._clock() >= deadline:
                    raise DeadlineExceeded(
                        f"deadline passed while model {e.manifest.model!r} was loading", reason="deadline"
                    ) from None

    def _start_load(self, e: ModelEntry) -> asyncio.Task:
        """The lifecycle said START_LOAD (single flight: only this caller): the load's task."""
        e.load_task = asyncio.get_running_loop().create_task(self._load(e))
        e.load_task.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved by waiters
        return e.load_task

    async def enforce_watermark(self, measured_used: int | None = None) -> int:
        """Evict (best effort) once measured use passes the high watermark, down to the low one."""
        return await self.evictor.enforce_watermark(measured_used)

    async def _load(self, e: ModelEntry) -> None:
        m = e.manifest
        estimate = e.last_memory_bytes or m.total_bytes
        t0 = self._clock()
        started: list[float] = []

        def load(progress: LoadProgress) -> LoadResult:
            started.append(self._clock())
            return self.loader.load(m, progress, reserve_bytes=e.last_memory_bytes)

        try:
            await self.evictor.make_room(e)
            t1 = self._clock()
            e.load_progress = LoadProgress(self._clock)
            res = await asyncio.get_running_loop().run_in_executor(self._load_pool, load, e.load_progress)
        except Unavailable as err:
            if err.reason == "no_capacity":
                if e.state is ModelState.LOADING:  # (a refused reservation is ABSENT already)
                    self.residency.no_room(e.key)  # nothing wrong with the model: no room now, try again later
                raise
            self._failed(e, err)
            raise self._load_error(e, err) from err
        except Exception as err:  # noqa: BLE001 - every failure marks the model FAILED, then reaches waiters
            self._failed(e, err)
            raise self._load_error(e, err) from err
        finally:
            e.load_task = None
            e.load_progress = None
        self._loaded(e, res)
        self._metrics.load_path({"evict": t1 - t0, "pool_wait": started[0] - t1, **res.waits,
                                 "total": self._clock() - t0})
        if res.source_tier != "ram" and self.loader.ram is not None:
            fill = asyncio.get_running_loop().run_in_executor(self._load_pool, self.loader.remember, m)
            fill.add_done_callback(lambda f: f.cancelled() or f.exception() and log.warning("RAM tier fill: %s", f.exception()))
        if e.memory_bytes > estimate:  # measured more than was reserved: back under the watermarks
            await self.enforce_watermark()

    @staticmethod
    def _backoff_error(e: ModelEntry, now: float, reason: str = "load_failed", detail: str = "") -> Unavailable:
        """A FAILED model's answer until its backoff passes: UNAVAILABLE, the model's own error, and the time
        to the next attempt as retry-after-ms (at least 1)."""
        m = e.manifest
        wait_ms = max(int((e.retry_at - now) * 1000), 1)
        return Unavailable(f"model {m.model!r} version {m.version!r} failed to load: {e.error} "
                           f"(next attempt in {wait_ms} ms)", reason=reason, retry_after_ms=wait_ms, detail=detail)

    def _load_error(self, e: ModelEntry, err: Exception) -> ServingError:
        """What every waiter of a failed load reads: the backoff answer (the same as a request inside that
        backoff gets), so that a router retries later instead of taking the host for down. Storage that is
        down keeps its reason; anything else is `load_failed` (or the loader's more precise reason,
        `warmup_failed`)."""
        reason = err.reason if isinstance(err, Unavailable) and err.reason else "load_failed"
        return self._backoff_error(e, self._clock(), reason, err.detail if isinstance(err, ServingError) else "")

    def _failed(self, e: ModelEntry, err: Exception) -> None:
        m = e.manifest
        error = err.message if isinstance(err, ServingError) else f"{type(err).__name__}: {err}"
        self.residency.failed(e.key, error, self._clock())  # frees the reservation; FAILED with a backoff
        self._metrics.failed(m)
        reason = err.wire_reason if isinstance(err, ServingError) else "internal"
        detail = err.detail if isinstance(err, ServingError) and err.detail else ""
        log.error("load of %s/%s v%s failed (%s): %s%s", m.tenant, m.model, m.version, reason, e.error,
                  f" [{detail}]" if detail else "")

    def _runner(self, e: ModelEntry, res: LoadResult) -> ModelRunner:
        m = e.manifest
        b = m.batching
        key = e.key
        return ModelRunner(
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
            on_busy=lambda busy: self.cache.set_busy(key, busy),
        )

    def _loaded(self, e: ModelEntry, res: LoadResult) -> None:
        m = e.manifest
        e.loaded = res.model
        # The probe's reading when plausible; otherwise (RSS on CPU can miss memory the allocator reused)
        # the larger of the file size and the last plausible measurement of this model.
        e.memory_bytes = res.memory_delta if res.memory_plausible else max(m.total_bytes, e.last_memory_bytes)
        if res.memory_plausible:
            e.last_memory_bytes = res.memory_delta
        # what a reload would cost: from the RAM tier only deserialize + warm-up, else the whole load
        e.load_cost_s = (res.timings["deserialize"] + res.timings["warmup"]) if self.loader.ram is not None else sum(res.timings.values())
        e.runner = self._runner(e, res)
        e.last_used = self._clock()
        self.residency.loaded(e.key, e.memory_bytes, e.load_cost_s, e.last_used)
        self._metrics.loaded(m, res, e.memory_bytes)
        self._update_resident()
        self._metrics.tiers()
        log.info(
            "loaded %s/%s v%s from %s: %.1f MB%s in %.2fs",
            m.tenant, m.model, m.version, res.source_tier, e.memory_bytes / 1e6,
            "" if res.memory_plausible else f" (probe saw {res.memory_delta / 1e6:.1f} MB; using the larger estimate)",
            sum(res.timings.values()),
        )

    def _pin(self, e: ModelEntry, pinned: bool) -> None:
        self.residency.pin(e.key, pinned)

    async def load(self, tenant: str, model: str, version: str | None = None, pin: bool | None = None) -> ModelEntry:
        e = await self.resolve(tenant, model, version)
        if pin is not None:
            self._pin(e, pin)
        if e.state is ModelState.FAILED:
            e.life.retry_now()  # an explicit load retries at once
        await self.ready_runner(e)
        return e

    # ---- unloading ---------------------------------------------------------------------------------
    async def unload(self, e: ModelEntry, drain_timeout_s: float = 30.0, reason: str = "explicit") -> None:
        if e.state is ModelState.LOADING and e.load_task is not None:
            try:
                await asyncio.shield(e.load_task)
            except Exception:  # noqa: BLE001 - a failed load leaves nothing to unload
                pass
        if e.state is ModelState.UNLOADING and e.unload_task is not None:
            await asyncio.shield(e.unload_task)
            return
        if not self.residency.begin_unload(e.key):  # FAILED forgets its failure; ABSENT, LOADING: nothing to do
            return
        self._metrics.evicted(reason)
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
            self._metrics.unloaded(e.manifest, bool(e.memory_bytes))
            e.memory_bytes = 0
            e.unload_task = None
            self.residency.unloaded(e.key)
            self._update_resident()
            self._metrics.tiers()

    async def unload_model(self, tenant: str, model: str) -> int:
        """Unload every resident version of a model; returns how many were unloaded."""
        targets = [e for (t, mname, _), e in self.entries.items() if t == tenant and mname == model]
        if not targets and not (await self.catalog.item(tenant, model)).versions:
            raise NotFound(f"model {shown(model)} not found")
        n = 0
        for e in targets:
            if e.state in (ModelState.READY, ModelState.LOADING, ModelState.FAILED):
                await self.unload(e)
                n += 1
            self._pin(e, False)
        return n

    def _update_resident(self) -> None:
        self._metrics.resident(sum(1 for e in self.entries.values() if e.state is ModelState.READY))

    # ---- the whole host ----------------------------------------------------------------------------
    async def preload_all(self) -> None:
        manifests = await asyncio.to_thread(self.repo.all_manifests)
        for m in manifests:
            try:
                await self.load(m.tenant, m.model, m.version)
            except ServingError as err:
                log.error("preload of %s/%s v%s failed: %s", m.tenant, m.model, m.version, err.message)

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
        self.catalog.close()

    def _resident(self, tenant: str, model: str) -> bool:
        """Some version of the model is on the device (or on its way): the catalog view keeps its versions
        even when a listing comes back empty."""
        return any(t == tenant and m == model and e.state is not ModelState.ABSENT and e.state is not ModelState.FAILED
                   for (t, m, _), e in self.entries.items())
