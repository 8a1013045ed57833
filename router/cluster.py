"""The router's local view of the hosts, refreshed in the background (never on the request path).

Sources: HeartbeatReader (Redis mode: what hostds publish, see hostd/heartbeat.py) and StaticHosts
(embedded mode: HostdControl.Status polled on a fixed list). Both give address -> HostStatus (or None
when a static host did not answer); ClusterView.apply turns that into per-host state and the placement
policy's HostView.

A host that fails a forward is marked DOWN at once; it comes back only with a status newer than the one
held when it went down (a stale heartbeat that is still in Redis does not revive a killed host).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

from ground.wire import heartbeat_index_key as index_key
from ground.wire import heartbeat_status_key as status_key
from protos import hostd_control_pb2 as hc
from router.admission_policy import RecentTimes
from router.placement_policy import HostView, ModelLoad, Residency


class HostState(str, Enum):
    UP = "UP"
    DRAINING = "DRAINING"
    DOWN = "DOWN"


@dataclass
class Host:
    address: str
    state: HostState = HostState.DOWN
    host_id: str = ""
    sent_unix: float = 0.0
    down_at_sent: float | None = None  # sent_unix of the status held when marked down
    view: HostView | None = None
    status: hc.HostStatus | None = None


def model_key(tenant: str, model: str, version: str = "") -> str:
    return f"{tenant}/{model}/{version}" if version else f"{tenant}/{model}"


def view_from_status(s: hc.HostStatus) -> tuple[HostView, dict[str, int]]:
    """The placement policy's view of one host, and the measured size of each model on it."""
    models: dict[str, ModelLoad] = {}
    sizes: dict[str, int] = {}
    lru = float("inf")
    count = 0
    for m in s.models:
        if m.state not in ("READY", "LOADING"):
            continue
        count += 1
        st = Residency(m.state)
        vkey, mkey = model_key(m.tenant, m.model, m.version), model_key(m.tenant, m.model)
        models[vkey] = ModelLoad(st, m.queue_depth, m.in_flight)
        prev = models.get(mkey)
        if prev is None:
            models[mkey] = ModelLoad(st, m.queue_depth, m.in_flight)
        else:  # several versions: READY wins, work adds up
            best = Residency.READY if Residency.READY in (prev.state, st) else st
            models[mkey] = ModelLoad(best, prev.queue_depth + m.queue_depth, prev.in_flight + m.in_flight)
        if st is Residency.READY:
            if m.last_used_unix:
                lru = min(lru, m.last_used_unix)
            if m.memory_bytes:
                sizes[vkey] = sizes[mkey] = max(sizes.get(mkey, 0), m.memory_bytes)
    budget = s.device_memory_budget or s.device_memory_total
    free = max(0, budget - s.device_memory_used) if budget else 0
    return HostView(s.address, free, models, count, lru, s.host_group), sizes


class ClusterView:
    def __init__(self, missing_grace_s: float = 0.0) -> None:
        self.hosts: dict[str, Host] = {}
        self.missing_grace_s = missing_grace_s
        self._missing_since: dict[str, float] = {}  # address -> when a complete refresh first lacked it
        self.sizes: dict[str, int] = {}
        self._eligible: list[HostView] = []
        self._times: dict[str, list[tuple[str, RecentTimes]]] = {}  # model key -> (host, times) where READY

    def apply(self, statuses: Mapping[str, hc.HostStatus | None], complete: bool, now: float = 0.0) -> None:
        """Take a refresh. `complete`: hosts missing from `statuses` are gone (their heartbeat expired), once
        they have been missing for `missing_grace_s` (on the caller's clock `now`): an index that vanished as
        a whole (a Redis FLUSHALL, a failover to an empty replica) is back within one heartbeat interval, and
        dropping every host meanwhile would refuse every request with `no_host`."""
        if complete:
            for addr in list(self._missing_since):
                if addr in statuses or addr not in self.hosts:
                    del self._missing_since[addr]
            for addr in [a for a in self.hosts if a not in statuses]:
                since = self._missing_since.setdefault(addr, now)
                if now - since >= self.missing_grace_s:
                    del self.hosts[addr]
                    del self._missing_since[addr]
        sizes: dict[str, int] = {}
        for addr, s in statuses.items():
            h = self.hosts.setdefault(addr, Host(addr))
            if s is None:  # a static host that did not answer
                if h.state is not HostState.DOWN:
                    h.state, h.down_at_sent = HostState.DOWN, h.sent_unix
                continue
            if h.state is HostState.DOWN and h.down_at_sent is not None and s.sent_unix <= h.down_at_sent:
                continue  # the same (stale) status we had when it failed
            h.view, host_sizes = view_from_status(s)
            sizes.update(host_sizes)
            h.status, h.host_id, h.sent_unix, h.down_at_sent = s, s.host_id, s.sent_unix, None
            h.state = HostState.DRAINING if s.draining else HostState.UP
        self.sizes = sizes
        self._times = recent_times_index(self.hosts.values())
        self._rebuild()

    def recent_times(self, key: str) -> list[RecentTimes]:
        """The model's recent queue/compute times on each UP host that has it READY (for admission)."""
        up = {v.address for v in self._eligible}
        return [t for addr, t in self._times.get(key, ()) if addr in up]

    def mark_down(self, address: str) -> bool:
        """True if the host was not already down."""
        h = self.hosts.get(address)
        if h is None or h.state is HostState.DOWN:
            return False
        h.state, h.down_at_sent = HostState.DOWN, h.sent_unix
        self._rebuild()
        return True

    def _rebuild(self) -> None:
        self._eligible = [h.view for h in self.hosts.values() if h.state is HostState.UP and h.view is not None]

    def eligible(self) -> list[HostView]:
        return self._eligible

    def size_of(self, key: str) -> int:
        return self.sizes.get(key, 0)

    def states(self, tenant: str) -> dict[tuple[str, str], str]:
        """(model, version) -> best state on any UP host: READY, else LOADING."""
        out: dict[tuple[str, str], str] = {}
        for h in self.hosts.values():
            if h.state is not HostState.UP or h.status is None:
                continue
            for m in h.status.models:
                if m.tenant == tenant and m.state in ("READY", "LOADING"):
                    k = (m.model, m.version)
                    if out.get(k) != "READY":
                        out[k] = m.state
        return out

    def holders(self, key: str) -> list[str]:
        return [v.address for v in self._eligible if key in v.models]


def recent_times_index(hosts) -> dict[str, list[tuple[str, RecentTimes]]]:
    out: dict[str, list[tuple[str, RecentTimes]]] = {}
    for h in hosts:
        if h.status is None:
            continue
        for m in h.status.models:
            if m.state != "READY":
                continue
            t = RecentTimes(m.queue_ms_recent, m.compute_ms_recent, m.queue_depth)
            for k in {model_key(m.tenant, m.model, m.version), model_key(m.tenant, m.model)}:
                out.setdefault(k, []).append((h.address, t))
    return out


class HeartbeatReader:
    """Redis mode: the hosts whose heartbeat has not expired."""

    def __init__(self, client, prefix: str) -> None:
        self.r = client  # redis.asyncio, bytes responses
        self.prefix = prefix
        self.complete = True

    async def read(self) -> dict[str, hc.HostStatus | None]:
        ids = sorted(m.decode() if isinstance(m, bytes) else m for m in await self.r.smembers(index_key(self.prefix)))
        if not ids:
            return {}
        raws = await self.r.mget([status_key(self.prefix, i) for i in ids])
        out: dict[str, hc.HostStatus | None] = {}
        gone = []
        for i, raw in zip(ids, raws, strict=True):
            if raw is None:
                gone.append(i)
                continue
            s = hc.HostStatus.FromString(raw)
            out[s.address] = s
        if gone:  # expired: tidy the index (a live host re-adds itself on its next beat)
            await self.r.srem(index_key(self.prefix), *gone)
        return out


class StaticHosts:
    """Embedded mode: poll HostdControl.Status on each configured address."""

    def __init__(self, forwarder, addresses: list[str], timeout_s: float, down_after: int = 3) -> None:
        """`down_after`: failed polls in a row before a host counts as down. One slow answer is a busy event
        loop (a hostd receiving 60 MB bodies missed a 1 s poll and every request got `no_host`); a host that
        is really gone fails requests too, and those mark it down at once (router/dispatcher.py)."""
        self.forwarder = forwarder
        self.addresses = addresses
        self.timeout_s = timeout_s
        self.down_after = down_after
        self.complete = False
        self._last: dict[str, hc.HostStatus] = {}
        self._fails: dict[str, int] = {}

    async def read(self) -> dict[str, hc.HostStatus | None]:
        async def one(addr: str) -> hc.HostStatus | None:
            try:
                s = await self.forwarder.status(addr, self.timeout_s)
            except Exception:  # noqa: BLE001 - any failure means "not answering"
                n = self._fails[addr] = self._fails.get(addr, 0) + 1
                return self._last.get(addr) if n < self.down_after else None
            s.address = addr  # the address we reach it at is the one that counts
            self._fails[addr] = 0
            self._last[addr] = s
            return s

        results = await asyncio.gather(*(one(a) for a in self.addresses))
        return dict(zip(self.addresses, results, strict=True))
