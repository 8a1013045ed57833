"""The full engine: hosts with one device each (byte budget, eviction policy, single-flight loads, one
loader at a time), per-model queues formed into batches by hostd.batch_policy.decide, executors whose batch
time follows the cost model. Latency = completion - arrival; shed requests never run.

Hooks:
- admission(key, tenant, now, cluster) -> None to admit, or a shed reason ("quota", ...)
- placement(model index, now, cluster) -> host index; the default prefers a host with the model ready or
  loading, else the one with the most free bytes (lowest index on ties). sim/placement.py drives the
  router's real policy; a hook may call `cluster.start_copy` to load another copy (hot models).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from enum import Enum

from hostd.batch_policy import BatchConfig, Pending, decide
from hostd.cache.policy import Resident, Share, bytes_to_free, make_policy, plan_eviction
from sim.costs import CostModel
from sim.engine import EventLoop
from sim.stats import SimResult, TenantStats
from sim.tiers import Tiers
from sim.workload import Workload


class SlotState(Enum):
    LOADING = "loading"
    READY = "ready"


@dataclass
class Slot:
    state: SlotState
    free: int  # idle executors
    queue: list[Pending] = field(default_factory=list)
    inflight: int = 0  # batches running
    running: int = 0  # requests in those batches
    wake_at: float = math.inf


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
    max_queue: int = 1024
    deadline_s: float = math.inf  # per request, from arrival
    host_ram_bytes: int = 0


class Host:
    def __init__(self, index: int, cfg: ClusterConfig) -> None:
        self.index = index
        self.budget = cfg.device_bytes
        self.policy = make_policy(cfg.policy)
        self.tiers = Tiers(cfg.host_ram_bytes)
        self.residents: dict[int, Resident] = {}
        self.slots: dict[int, Slot] = {}
        self.used = 0
        self.tenant_bytes: dict[str, int] = {}
        self.loader_free_at = 0.0

    @property
    def free_bytes(self) -> int:
        return self.budget - self.used


Admission = Callable[[str, str, float, "Cluster"], "str | None"]
Placement = Callable[[int, float, "Cluster"], int]


def default_placement(model: int, now: float, cluster: Cluster) -> int:
    for h in cluster.hosts:
        if model in h.slots:
            return h.index
    return max(cluster.hosts, key=lambda h: (h.free_bytes, -h.index)).index


class Cluster:
    def __init__(
        self,
        wl: Workload,
        cfg: ClusterConfig,
        costs: CostModel | None = None,
        admission: Admission | None = None,
        placement: Placement | None = None,
    ) -> None:
        self.wl, self.cfg, self.costs = wl, cfg, costs or CostModel()
        self.admission, self.placement = admission, placement or default_placement
        self.loop = EventLoop(float(wl.ts[0]) if len(wl) else 0.0)
        self.hosts = [Host(i, cfg) for i in range(cfg.hosts)]
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
        slot = host.slots.get(m)
        if slot is not None and slot.state is SlotState.READY:
            st.hits += 1
            r = host.residents[m]
            r.hits += 1
            r.last_use = now
            host.policy.on_access(m, now, size, r.load_cost)
        else:
            st.bytes_missed += size
            if slot is None:
                slot = self._start_load(host, m, now)
                if slot is None:
                    return
        if len(slot.queue) >= self.cfg.max_queue:
            self._shed(tenant, "queue_full")
            return
        self._arrival[seq] = now
        slot.queue.append(Pending(seq, now, deadline=now + self.cfg.deadline_s))
        host.residents[m].busy = True
        self._kick(host, m)

    def start_copy(self, host_index: int, m: int, now: float) -> bool:
        """Load model `m` on a host that does not hold it (a placement hook's extra copy of a hot model).
        False when the host already holds it or has no room."""
        host = self.hosts[host_index]
        if m in host.slots:
            return False
        return self._start_load(host, m, now) is not None

    def _start_load(self, host: Host, m: int, now: float) -> Slot | None:
        spec = self.wl.models[m]
        need = bytes_to_free(host.used, host.budget, self.cfg.high, self.cfg.low, spec.size)
        if need > 0 or self.cfg.shares:
            plan = plan_eviction(host.policy, host.residents, need, spec.tenant, self.cfg.shares, now,
                                 incoming_bytes=spec.size, tenant_bytes=host.tenant_bytes)
            if not plan.ok:
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
        rcost = self.costs.load_seconds(spec.size, host.tiers.reload_tier)
        host.residents[m] = Resident(m, spec.tenant, spec.size, now, rcost, 0, True, m in self._pinned)
        host.used += spec.size
        host.tenant_bytes[spec.tenant] = host.tenant_bytes.get(spec.tenant, 0) + spec.size
        slot = host.slots[m] = Slot(SlotState.LOADING, self.cfg.executors_per_model)
        self.loop.schedule(done, self._loaded, host, m)
        return slot

    def _evict(self, host: Host, keys: tuple) -> None:
        for k in keys:
            r = host.residents.pop(k)
            del host.slots[k]
            host.used -= r.size
            host.tenant_bytes[r.tenant] -= r.size
            host.policy.on_evict(k)
            host.tiers.on_evict(k, r.size)

    def _loaded(self, host: Host, m: int) -> None:
        now = self.loop.now
        host.slots[m].state = SlotState.READY
        r = host.residents[m]
        r.last_use = now
        host.policy.on_access(m, now, r.size, r.load_cost)
        if self.cfg.high < 1.0:  # watermark eviction, best effort
            need = bytes_to_free(host.used, host.budget, self.cfg.high, self.cfg.low)
            if need > 0:
                plan = plan_eviction(host.policy, host.residents, need, None, self.cfg.shares, now,
                                     tenant_bytes=host.tenant_bytes)
                self._evict(host, plan.evict)
        self._kick(host, m)

    def _kick(self, host: Host, m: int) -> None:
        slot = host.slots[m]
        if slot.state is not SlotState.READY:
            return
        now = self.loop.now
        tenant = self._tenant_of[m]
        while True:
            d = decide(slot.queue, now, slot.free, self.cfg.batch)
            gone = set(d.expired) | set(d.rejected) | set(d.run)
            if gone:
                slot.queue = [p for p in slot.queue if p.seq not in gone]
            for s in d.expired + d.rejected:
                del self._arrival[s]
            if d.expired:
                self._shed(tenant, "deadline", len(d.expired))
            if d.rejected:
                self._shed(tenant, "queue_timeout", len(d.rejected))
            if d.run:
                slot.free -= 1
                slot.inflight += 1
                slot.running += len(d.run)
                secs = self.costs.batch_seconds(self.wl.models[m].key, len(d.run))
                self.loop.after(secs, self._batch_done, host, m, d.run)
                continue
            if d.wake_at is not None and d.wake_at < slot.wake_at:
                slot.wake_at = d.wake_at
                self.loop.schedule(d.wake_at, self._wake, host, m, d.wake_at)
            break
        host.residents[m].busy = bool(slot.queue or slot.inflight)

    def _wake(self, host: Host, m: int, at: float) -> None:
        slot = host.slots.get(m)
        if slot is not None and slot.wake_at == at:
            slot.wake_at = math.inf
            self._kick(host, m)

    def _batch_done(self, host: Host, m: int, seqs: tuple[int, ...]) -> None:
        now = self.loop.now
        lat = self.stats[self._tenant_of[m]].latencies
        extra = self.costs.request_overhead_s
        for s in seqs:
            lat.append(now - self._arrival.pop(s) + extra)
        slot = host.slots[m]
        slot.free += 1
        slot.inflight -= 1
        slot.running -= len(seqs)
        self._kick(host, m)


def run_cluster(wl: Workload, cfg: ClusterConfig, costs: CostModel | None = None, **hooks) -> SimResult:
    return Cluster(wl, cfg, costs, **hooks).run()
