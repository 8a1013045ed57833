"""The full engine: hosts that each run the host core (hostd/core/) on a virtual clock. Per host: the
device cache (byte budget, eviction policy, shares) and each model's lifecycle (single-flight loads; a
load with no room is shed), kept together by the core's Residency; each model's queue (batches formed by
hostd.batch_policy.decide over its executors); and the host's execution slots (fair across tenants,
hostd.sched_policy: by tenant, then model; one model holds at most all slots but one), tied to the queues by
the core's Dispatcher. What the simulator adds is only the cost model (sim/costs.py: load and batch times;
optionally CPU contention, ClusterConfig.cores and threads) and the virtual clock (sim/engine.py). Latency =
completion - arrival (+ the cost model's per-request overhead, drawn from the spread of the requests that
waited on a load for those that did: not served from a ready model on arrival; by how long they waited,
where the cost model has bins for it); shed requests never run.

Loads: with `load_workers` 0 (the default), one load at a time per host, evictions instant. With
`load_workers` N, hostd's load path (sim/loadpool.py): N load threads take loads, closes of evicted models
and RAM-tier fills in FIFO order; a load's deserialize and warm-up hold the loader's lock (one per host). A
load that needs room first closes its victims one after the other through that pool (the eviction wait);
a victim is UNLOADING until its close ends, and a request for it then waits and loads it again. Waits per
load are kept in `Cluster.load_waits`. Each load's locked stage may be drawn from a measured spread
(CostModel.locked_spread, with streaks: locked_corr) and its measured size from `size_spread`; the draws
come from a generator seeded with `seed`. With `attempts` > 1, a host with no room (every resident busy) or a
full queue sends the request to another host, as the router retries no_capacity and queue_full: the placement
hook is asked again with the hosts tried so far excluded (router/dispatcher.py).

Hooks (adapters for the router's side):
- admission: AdmissionHook(key, tenant, now, cluster) -> None to admit, or a shed reason ("quota", ...)
- placement: PlacementHook(model index, now, cluster, exclude=()) -> host index, or None when every host is
  excluded; `exclude`: the host indexes a retry must not pick (the hook is called without it first, so a hook
  that never sees a retry may ignore it). The default prefers a host with the model ready or loading, else the
  one with the most free bytes (lowest index on ties). sim/placement.py drives the router's real policy; a
  hook may call `cluster.start_copy` to load another copy (hot models).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from hostd.batch_policy import BatchConfig, Pending
from hostd.cache.policy import Share
from hostd.core.device import DeviceCache
from hostd.core.lifecycle import Action, Lifecycle, ModelState
from hostd.core.queue import ModelQueue
from hostd.core.residency import Residency
from hostd.core.dispatch import Cost, Dispatcher, Step
from hostd.core.slots import ExecutionSlots
from hostd.sched_policy import FairUnit
from sim.costs import CostModel, spread_points
from sim.engine import EventLoop
from sim.loadpool import Job, LoadPool, Progress
from sim.stats import SimResult, TenantStats
from sim.tiers import Tiers
from sim.workload import Workload


@dataclass
class ClusterConfig:
    hosts: int = 1
    device_bytes: int = 8 << 30
    policy: str = "lru"
    high: float = 1.0
    low: float = 1.0
    shares: Mapping[str, Share] | None = None
    pinned: Collection[str] = ()
    batch: BatchConfig = BatchConfig(max_batch_size=32, max_queue_delay=0.0)
    executors_per_model: int = 1
    # Host-wide execution slots (batches running at once on a host, granted fairly across tenants, as
    # hostd's execution_slots). 0: no host-wide limit, every model's executors run at once.
    slots: int = 0
    weights: Mapping[str, float] | None = None  # tenant weights for the slots' fair share (default 1)
    per_model_slots: int = 0  # slots one model may hold (hostd's execution_slots_per_model; 0 = all but one)
    fair_unit: FairUnit = "model"  # hostd's fair_unit: tenant, or model within a tenant
    # CPU contention (0 = off: a batch takes the cost model's time whatever else runs). With `cores`, a batch
    # started while running batches' threads (each `threads`, hostd's intra-op threads) exceed the cores is
    # slowed by (running batches x threads) / cores: the cost of slots x threads > cores.
    cores: int = 0
    threads: int = 1
    max_queue: int = 1024
    deadline_s: float = math.inf  # per request, from arrival
    host_ram_bytes: int = 0
    load_workers: int = 0  # hostd's load threads (4); 0: one load at a time, instant evictions (the old model)
    attempts: int = 1  # hosts tried per request on no_capacity / queue_full (the router's max_attempts: 3)
    seed: int = 0  # the draws of the locked stage's spread (sim.costs.CostModel.locked_spread) and of sizes
    # How a model's measured size varies from load to load (hostd measures each load; on CPU an RSS delta):
    # (measured / the model's size, cumulative probability). Each load draws its size; the host reserves what
    # it measured last time (the model's size the first time) and, when the load measured more, evicts down
    # to the low watermark, as hostd does. Empty: every load measures the model's size.
    size_spread: tuple[tuple[float, float], ...] = ()


@dataclass
class HostedModel:
    """One model on one simulated host: its lifecycle and its queue (both host core classes)."""

    life: Lifecycle
    queue: ModelQueue
    wake_at: float = math.inf  # a wake-up is scheduled for then

    @property
    def state(self) -> ModelState:
        return self.life.state


class SimHost:
    def __init__(self, index: int, cfg: ClusterConfig, cost: Cost) -> None:
        self.index = index
        self.cache = DeviceCache(cfg.device_bytes, cfg.high, cfg.low, cfg.policy, cfg.shares)
        self.residency = Residency(self.cache)
        weights = dict(cfg.weights or {})
        slots = ExecutionSlots(cfg.slots or math.inf, lambda t: weights.get(t, 1.0), per_model=cfg.per_model_slots,
                               unit=cfg.fair_unit)
        self.dispatch = Dispatcher(slots, cost)
        self.running = 0  # batches running (CPU contention)
        self.tiers = Tiers(cfg.host_ram_bytes)
        self.models: dict[int, HostedModel] = {}  # loading or ready (or waiting for its own unload to end)
        self.loader_free_at = 0.0
        self.pool = LoadPool(cfg.load_workers) if cfg.load_workers > 0 else None
        self.measured: dict[int, int] = {}  # model -> the size its last load measured (size_spread)
        self.loading_size: dict[int, int] = {}  # model -> the size the load under way will measure
        self.ready_at: dict[int, float] = {}  # model -> when its last load ended (its waiters' load wait)
        self.loaded_before: set[int] = set()  # models this host has loaded: their reloads prepack after READY

    @property
    def slots(self) -> ExecutionSlots:
        return self.dispatch.slots

    @property
    def budget(self) -> int:
        return self.cache.budget

    @property
    def free_bytes(self) -> int:
        return self.cache.free_bytes


AdmissionHook = Callable[[str, str, float, "Cluster"], "str | None"]


class PlacementHook(Protocol):
    def __call__(self, model: int, now: float, cluster: Cluster, /, exclude: Collection[int] = ()) -> int | None: ...


def default_placement(model: int, now: float, cluster: Cluster, exclude: Collection[int] = ()) -> int | None:
    hosts = [h for h in cluster.hosts if h.index not in exclude]
    for h in hosts:
        if model in h.models:
            return h.index
    return max(hosts, key=lambda h: (h.free_bytes, -h.index)).index if hosts else None


class Cluster:
    def __init__(
        self,
        wl: Workload,
        cfg: ClusterConfig,
        costs: CostModel | None = None,
        admission: AdmissionHook | None = None,
        placement: PlacementHook | None = None,
    ) -> None:
        self.wl, self.cfg, self.costs = wl, cfg, costs or CostModel()
        self.admission = admission
        self.placement: PlacementHook = placement or default_placement
        self.loop = EventLoop(float(wl.ts[0]) if len(wl) else 0.0)
        keys = [m.key for m in wl.models]
        batch_cost = self.costs.batch_seconds
        self.hosts = [SimHost(i, cfg, lambda m, n: batch_cost(keys[m], n)) for i in range(cfg.hosts)]
        self.stats = {t: TenantStats() for t in wl.tenants}
        self.shed_reasons: dict[str, int] = {}
        self._ts, self._model = wl.ts.tolist(), wl.model.tolist()
        self._tenant_of = [m.tenant for m in wl.models]
        self._pinned = {i for i, m in enumerate(wl.models) if m.key in cfg.pinned}
        self._arrival: dict[int, tuple[float, bool]] = {}  # queued request -> (arrival, waited on a load)
        # per load (pool mode): seconds in each stage of hostd's load path, as its load-path histogram
        self.load_waits: dict[str, list[float]] = {"evict": [], "pool_wait": [], "lock_wait": [], "locked": [],
                                                   "total": []}
        self._rng = random.Random(cfg.seed)
        # the measured-size spread as np.interp's (p, x) arrays, once: drawn at every load
        self._size_points = spread_points(cfg.size_spread) if cfg.size_spread else None
        self._overhead_rng = random.Random(cfg.seed + 1_000_003)  # its own stream: the load draws stay as they were
        self._window_draw: dict[int, float] = {}
        self.evictions = {"capacity": 0, "watermark": 0}

    def run(self) -> SimResult:
        if self._ts:
            self.loop.schedule(self._ts[0], self._arrive, 0)
        self.loop.run()
        return SimResult(self.cfg.policy, self.cfg.device_bytes, self.stats, dict(self.shed_reasons))

    def _shed(self, tenant: str, reason: str, n: int = 1) -> None:
        self.stats[tenant].shed += n
        self.shed_reasons[reason] = self.shed_reasons.get(reason, 0) + n

    # ---- arrivals and loads ------------------------------------------------------------------------
    def _arrive(self, seq: int) -> None:
        if seq + 1 < len(self._ts):
            self.loop.schedule(self._ts[seq + 1], self._arrive, seq + 1)
        now, m = self.loop.now, self._model[seq]
        tenant, size = self._tenant_of[m], self.wl.models[m].size
        st = self.stats[tenant]
        st.requests += 1
        st.bytes_requested += size
        if self.admission is not None:
            reason = self.admission(self.wl.models[m].key, tenant, now, self)
            if reason:
                st.bytes_missed += size
                self._shed(tenant, reason)
                return
        first = self.placement(m, now, self)
        assert first is not None, "a placement with nothing excluded picks a host"
        host = self.hosts[first]
        tried: set[int] = set()
        while True:
            tried.add(host.index)
            hm = host.models.get(m)
            hit = hm is not None and host.residency.want(m, now) is Action.SERVE
            if hm is None:
                hm = self._start_load(host, m, now)
            reason = "unavailable" if hm is None else "queue_full" if hm.queue.full else ""
            if not reason:
                break
            # a retry: placed again without the hosts tried (the router's dispatcher), None when none is left
            other = self.placement(m, now, self, exclude=frozenset(tried)) if len(tried) < self.cfg.attempts else None
            if other is None:
                st.bytes_missed += size
                self._shed(tenant, reason)
                return
            host = self.hosts[other]
        if hit:
            st.hits += 1
        else:
            st.bytes_missed += size
        self._arrival[seq] = (now, not hit)  # when it came, whether it waits on a load (its overhead's spread)
        hm.queue.add(Pending(seq, now, deadline=now + self.cfg.deadline_s))
        host.cache.set_busy(m, True)
        self._kick(host, m)

    def start_copy(self, host_index: int, m: int, now: float) -> bool:
        """Load model `m` on a host that does not hold it (a placement hook's extra copy of a hot model).
        False when the host already holds it or has no room."""
        host = self.hosts[host_index]
        if m in host.models:
            return False
        return self._start_load(host, m, now) is not None

    def _start_load(self, host: SimHost, m: int, now: float) -> HostedModel | None:
        """Start loading `m` on the host (or, pool mode, wait for its close to end and load it then); None
        when the host has no room for it (the model stays ABSENT)."""
        res = host.residency
        if m in self._pinned:
            res.pin(m, True)
        hm = HostedModel(res.life(m), ModelQueue(self.cfg.batch, self.cfg.executors_per_model, self.cfg.max_queue))
        if res.want(m, now) is Action.WAIT_UNLOAD:  # pool mode: closing; loaded again when the close ends
            host.models[m] = hm
            return hm
        # START_LOAD: ABSENT -> LOADING, this caller starts the load (single flight)
        return hm if self._reserve(host, m, hm, now) else None

    def _reserve(self, host: SimHost, m: int, hm: HostedModel, now: float) -> bool:
        spec = self.wl.models[m]
        estimate = host.measured.get(m, spec.size)
        plan = host.residency.reserve(m, spec.tenant, estimate, now)
        if not plan.ok:  # back to ABSENT
            return False
        if self._size_points is not None:
            ps, xs = self._size_points
            host.loading_size[m] = max(1, int(spec.size * float(np.interp(self._rng.random(), ps, xs))))
        host.models[m] = hm
        st = self.stats[spec.tenant]
        st.loads += 1
        tier = host.tiers.tier_of(m)
        host.tiers.on_load(m)
        if host.pool is None:
            self._evict(host, plan.evict)
            start = max(now, host.loader_free_at)
            done = start + self.costs.load_seconds(spec.size, tier)
            host.loader_free_at = done + self._prepack_s(host, m)  # the loader stays busy after READY
            st.load_s += done - start
            self.loop.schedule(done, self._loaded, host, m)
            return True
        self.evictions["capacity"] += len(plan.evict)
        locked = self.costs.locked_seconds(spec.size) * self.costs.locked_multiplier(self._locked_draw(now))
        load = Job("load", (m, now, tier), self.costs.first_seconds(spec.size, tier), locked)
        st.load_s += load.first_s + load.locked_s
        self._close_all(host, plan.evict, load, now)  # the victims closed one after the other, then the load
        return True

    def _prepack_s(self, host: SimHost, m: int) -> float:
        """The prepacking a load of `m` leaves for after READY: a reload's (this host loaded `m` before), else 0.
        Marks `m` loaded on this host."""
        again = m in host.loaded_before
        host.loaded_before.add(m)
        return self.wl.models[m].size * self.costs.prepack_s_per_byte if again else 0.0

    # ---- pool mode: hostd's load path ----------------------------------------------------------------
    def _locked_draw(self, now: float) -> float:
        """The uniform draw of a load's locked stage: its window's with probability locked_corr, else its own."""
        u = self._rng.random()
        if self.costs.locked_corr > 0 and self._rng.random() < self.costs.locked_corr:
            w = int(now // self.costs.locked_window_s)
            if w not in self._window_draw:
                self._window_draw = {w: self._rng.random()}  # windows only move forward
            return self._window_draw[w]
        return u

    def _begin_unload(self, host: SimHost, k: int) -> None:
        del host.models[k]
        host.dispatch.remove(k)
        host.residency.begin_unload(k)

    def _end_unload(self, host: SimHost, k: int) -> None:
        r = host.residency.unloaded(k)
        assert r is not None
        host.tiers.on_evict(k, r.size)

    def _close_all(self, host: SimHost, victims: tuple, load: Job | None, now: float) -> None:
        """Every victim UNLOADING from now, closed one after the other; then `load` (if any) is queued."""
        for k in victims:
            self._begin_unload(host, k)
        self._close_next(host, list(victims), load, now)

    def _close_next(self, host: SimHost, victims: list[int], load: Job | None, now: float) -> None:
        """Close the next victim; after the last, queue the load that needed the room (if any)."""
        assert host.pool is not None
        if victims:
            job = Job("close", (victims[0], victims[1:], load), self.costs.unload_s)
        elif load is None:
            return
        else:
            m, began, _ = load.ref
            self.load_waits["evict"].append(now - began)
            job = load
        self._pool(host, host.pool.submit(job, now))

    def _pool(self, host: SimHost, p: Progress) -> None:
        for job in p.started:
            self.loop.after(job.stage_s, self._pool_done, host, job)
        for job in p.finished:
            if job.kind == "load":
                m, began, tier = job.ref
                self.load_waits["pool_wait"].append(job.pool_wait)
                self.load_waits["lock_wait"].append(job.lock_wait)
                self.load_waits["locked"].append(job.locked_s)
                self.load_waits["total"].append(self.loop.now - began)
                prepack = self._prepack_s(host, m)
                self._loaded(host, m)
                if prepack > 0:  # a reload answers first, then prepacks under the lock (hostd/loader.py)
                    self._pool(host, host.pool.submit(Job("prepack", None, 0.0, prepack), self.loop.now))  # type: ignore[union-attr]
                if tier != "host_ram" and self.cfg.host_ram_bytes > 0:  # the RAM-tier fill, off the request path
                    fill = Job("fill", None, self.wl.models[m].size * self.costs.fill_s_per_byte)
                    self._pool(host, host.pool.submit(fill, self.loop.now))  # type: ignore[union-attr]
            elif job.kind == "close":
                self._closed(host, *job.ref)

    def _pool_done(self, host: SimHost, job: Job) -> None:
        assert host.pool is not None
        self._pool(host, host.pool.done(job, self.loop.now))

    def _closed(self, host: SimHost, k: int, rest: list[int], load: Job | None) -> None:
        now = self.loop.now
        self._end_unload(host, k)
        waiting = host.models.get(k)
        if waiting is not None and host.residency.want(k, now) is Action.START_LOAD:  # requests came meanwhile
            if not self._reserve(host, k, waiting, now):
                del host.models[k]
                tenant = self._tenant_of[k]
                for s in waiting.queue.clear():
                    del self._arrival[s]
                    self._shed(tenant, "unavailable")
        self._close_next(host, rest, load, now)

    def _evict(self, host: SimHost, keys: tuple) -> None:
        """Instant evictions (no load pool)."""
        for k in keys:
            self._begin_unload(host, k)
            self._end_unload(host, k)

    def _loaded(self, host: SimHost, m: int) -> None:
        now = self.loop.now
        hm = host.models[m]
        host.ready_at[m] = now
        size = host.loading_size.pop(m, self.wl.models[m].size)
        if self.cfg.size_spread:
            host.measured[m] = size
        host.residency.loaded(m, size, self.costs.load_seconds(size, host.tiers.reload_tier), now)
        host.dispatch.add(m, hm.queue, self._tenant_of[m])
        host.cache.set_busy(m, True)  # until its queue says otherwise (below, in _kick)
        if self.cfg.high < 1.0:  # watermark eviction, best effort
            evict = host.cache.watermark_plan(now).evict
            self.evictions["watermark"] += len(evict)
            if host.pool is None:
                self._evict(host, evict)
            elif evict:
                self._close_all(host, evict, None, now)
        self._kick(host, m)

    # ---- batches: the host core's dispatcher plans, the cost model executes -----------------------
    def _kick(self, host: SimHost, m: int) -> None:
        hm = host.models.get(m)
        if hm is None or hm.state is not ModelState.READY:
            return
        self._apply(host, host.dispatch.kick(m, self.loop.now))
        host.cache.set_busy(m, hm.queue.busy)

    def _apply(self, host: SimHost, step: Step) -> None:
        """Execute a dispatch step: shed what expired, run the started batches on the cost model."""
        for m, s in step.expired:
            del self._arrival[s]
            self._shed(self._tenant_of[m], "deadline")
        for m, s in step.rejected:
            del self._arrival[s]
            self._shed(self._tenant_of[m], "queue_timeout")
        cores, threads = self.cfg.cores, self.cfg.threads
        for m, seqs in step.started:
            t = self.costs.batch_seconds(self.wl.models[m].key, len(seqs))
            host.running += 1
            if cores:
                t *= max(1.0, host.running * threads / cores)
            self.loop.after(t, self._batch_done, host, m, seqs)
        for m, at in step.wake.items():
            hm = host.models.get(m)
            if hm is not None and at < hm.wake_at:
                hm.wake_at = at
                self.loop.schedule(at, self._wake, host, m, at)
        for m in {m for m, _ in step.started}:  # other models' batches may start on a freed slot
            host.cache.set_busy(m, host.models[m].queue.busy)

    def _wake(self, host: SimHost, m: int, at: float) -> None:
        hm = host.models.get(m)
        if hm is not None and hm.wake_at == at:
            hm.wake_at = math.inf
            self._kick(host, m)

    def _batch_done(self, host: SimHost, m: int, seqs: tuple[int, ...]) -> None:
        now = self.loop.now
        lat = self.stats[self._tenant_of[m]].latencies
        if self.costs.overhead_varies:  # each request draws its own (from a stream of its own), from the
            draw, extra = self._overhead_rng.random, self.costs.overhead_seconds  # spread of its kind
            ready = host.ready_at.get(m, now)  # a request that waited on a load waited until this
            for s in seqs:
                arrived, loaded = self._arrival.pop(s)
                lat.append(now - arrived + extra(draw(), loaded, ready - arrived))
        else:
            overhead = self.costs.request_overhead_s
            for s in seqs:
                lat.append(now - self._arrival.pop(s)[0] + overhead)
        host.running -= 1
        self._apply(host, host.dispatch.finish(m, len(seqs), now))
        hm = host.models.get(m)
        if hm is not None:
            host.cache.set_busy(m, hm.queue.busy)


def run_cluster(wl: Workload, cfg: ClusterConfig, costs: CostModel | None = None, **hooks) -> SimResult:
    return Cluster(wl, cfg, costs, **hooks).run()
