"""The full engine: hosts that each run the host core (hostd/core/) on a virtual clock. Per host: the
device cache (byte budget, eviction policy, shares) and each model's lifecycle (single-flight loads; a
load with no room is shed), kept together by the core's Residency; each model's queue (batches formed by
hostd.batch_policy.decide over its executors); and the host's execution slots (fair across tenants,
hostd.sched_policy: by tenant, then model; one model holds at most all slots but one), tied to the queues by
the core's Dispatcher. What the simulator adds is only the cost model (sim/costs.py: load and batch times,
one loader at a time per host; optionally CPU contention, ClusterConfig.cores and threads) and the virtual
clock (sim/engine.py). Latency = completion - arrival; shed requests never run.

Hooks (adapters for the router's side):
- admission: AdmissionHook(key, tenant, now, cluster) -> None to admit, or a shed reason ("quota", ...)
- placement: PlacementHook(model index, now, cluster) -> host index; the default prefers a host with the
  model ready or loading, else the one with the most free bytes (lowest index on ties). sim/placement.py
  drives the router's real policy; a hook may call `cluster.start_copy` to load another copy (hot models).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from hostd.batch_policy import BatchConfig, Pending
from hostd.cache.policy import Share
from hostd.core.device import DeviceCache
from hostd.core.lifecycle import Action, Lifecycle, ModelState
from hostd.core.queue import ModelQueue
from hostd.core.residency import Residency
from hostd.core.dispatch import Cost, Dispatcher, Step
from hostd.core.slots import ExecutionSlots
from hostd.sched_policy import FairUnit
from sim.costs import CostModel
from sim.engine import EventLoop
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
        self.models: dict[int, HostedModel] = {}  # loading or ready
        self.loader_free_at = 0.0

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
PlacementHook = Callable[[int, float, "Cluster"], int]


def default_placement(model: int, now: float, cluster: Cluster) -> int:
    for h in cluster.hosts:
        if model in h.models:
            return h.index
    return max(cluster.hosts, key=lambda h: (h.free_bytes, -h.index)).index


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
        self.admission, self.placement = admission, placement or default_placement
        self.loop = EventLoop(float(wl.ts[0]) if len(wl) else 0.0)
        keys = [m.key for m in wl.models]
        batch_cost = self.costs.batch_seconds
        self.hosts = [SimHost(i, cfg, lambda m, n: batch_cost(keys[m], n)) for i in range(cfg.hosts)]
        self.stats = {t: TenantStats() for t in wl.tenants}
        self.shed_reasons: dict[str, int] = {}
        self._ts, self._model = wl.ts.tolist(), wl.model.tolist()
        self._tenant_of = [m.tenant for m in wl.models]
        self._pinned = {i for i, m in enumerate(wl.models) if m.key in cfg.pinned}
        self._arrival: dict[int, float] = {}

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
        host = self.hosts[self.placement(m, now, self)]
        hm = host.models.get(m)
        if hm is not None and host.residency.want(m, now) is Action.SERVE:
            st.hits += 1
        else:
            st.bytes_missed += size
            if hm is None:
                hm = self._start_load(host, m, now)
                if hm is None:
                    return
        if hm.queue.full:
            self._shed(tenant, "queue_full")
            return
        self._arrival[seq] = now
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
        spec = self.wl.models[m]
        res = host.residency
        if m in self._pinned:
            res.pin(m, True)
        res.want(m, now)  # ABSENT -> LOADING: this caller starts the load (single flight)
        plan = res.reserve(m, spec.tenant, spec.size, now)
        if not plan.ok:  # back to ABSENT
            self._shed(spec.tenant, "unavailable")
            return None
        self._evict(host, plan.evict)
        tier = host.tiers.tier_of(m)
        start = max(now, host.loader_free_at)
        done = start + self.costs.load_seconds(spec.size, tier)
        host.loader_free_at = done
        st = self.stats[spec.tenant]
        st.loads += 1
        st.load_s += done - start
        host.tiers.on_load(m)
        hm = host.models[m] = HostedModel(res.life(m), ModelQueue(self.cfg.batch, self.cfg.executors_per_model, self.cfg.max_queue))
        self.loop.schedule(done, self._loaded, host, m)
        return hm

    def _evict(self, host: SimHost, keys: tuple) -> None:
        for k in keys:
            del host.models[k]
            host.dispatch.remove(k)
            host.residency.begin_unload(k)
            r = host.residency.unloaded(k)
            assert r is not None
            host.tiers.on_evict(k, r.size)

    def _loaded(self, host: SimHost, m: int) -> None:
        now = self.loop.now
        hm = host.models[m]
        size = self.wl.models[m].size
        host.residency.loaded(m, size, self.costs.load_seconds(size, host.tiers.reload_tier), now)
        host.dispatch.add(m, hm.queue, self._tenant_of[m])
        host.cache.set_busy(m, True)  # until its queue says otherwise (below, in _kick)
        if self.cfg.high < 1.0:  # watermark eviction, best effort
            self._evict(host, host.cache.watermark_plan(now).evict)
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
        extra = self.costs.request_overhead_s
        for s in seqs:
            lat.append(now - self._arrival.pop(s) + extra)
        host.running -= 1
        self._apply(host, host.dispatch.finish(m, len(seqs), now))
        hm = host.models.get(m)
        if hm is not None:
            host.cache.set_busy(m, hm.queue.busy)


def run_cluster(wl: Workload, cfg: ClusterConfig, costs: CostModel | None = None, **hooks) -> SimResult:
    return Cluster(wl, cfg, costs, **hooks).run()
