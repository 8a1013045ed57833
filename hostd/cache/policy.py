"""Cache eviction as pure code: which resident models to evict so that a load (or the watermark) fits.

No clock, no I/O: the hostd cache manager and the simulator in sim/ drive exactly this code, passing `now`.

How a caller uses it (hostd/core/device.py's DeviceCache, which hostd and sim/ both drive):
- Keep `residents: dict[key, Resident]` for every model that is loaded or loading on the device, and one
  policy object from `make_policy(name)` per device.
- Call `policy.on_access(key, now, size, cost)` when a load completes (the model becomes resident) and on
  every request served from the cache; `cost` is the measured seconds it would take to load the model again.
- To make room: `plan = plan_eviction(policy, residents, need_bytes, incoming_tenant, shares,
  incoming_bytes=size)`. If `plan.ok`, evict `plan.evict` in order and call `policy.on_evict(key)` for each
  key actually evicted; else refuse the load (UNAVAILABLE, reason `plan.reason`) and evict nothing.
- Watermarks: `need = bytes_to_free(used, budget, high, low, incoming)`; with `incoming_tenant=None` the
  plan is best effort: it lists what it can free even when that is less than `need` (`ok` is then False).

Policy state is explicit and lives in the policy object (plain dicts, no clock): the policy is told about
accesses and evictions and answers `victims()`, the tracked keys in evict-first order. `sync(residents)`
rebuilds that state from the records alone (after a restart, or to treat the records as the only input).
Which models may be evicted (busy, pinned, tenant shares) is decided by `plan_eviction`, never by a policy.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol

Key = Hashable


@dataclass(slots=True)
class Resident:
    """A model on the device (loaded or loading). Mutable: the caller updates it in place."""

    key: Key
    tenant: str
    size: int  # measured bytes on the device
    last_use: float = 0.0  # caller's clock, seconds
    load_cost: float = 0.0  # measured seconds to load it again
    hits: int = 0
    busy: bool = False  # requests in flight or queued, or still loading: never evicted
    pinned: bool = False  # never evicted


@dataclass(frozen=True, slots=True)
class Share:
    """A tenant's share of one device. guaranteed: bytes others' loads cannot take from it.
    maximum: bytes it may hold at most (None: no limit)."""

    guaranteed: int = 0
    maximum: int | None = None


@dataclass(frozen=True, slots=True)
class EvictionPlan:
    ok: bool  # True: evicting `evict` frees at least the bytes asked for
    evict: tuple[Key, ...] = ()  # keys to evict, in order
    freed: int = 0  # bytes `evict` frees
    reason: str = ""  # why not ok, for the UNAVAILABLE message


class EvictionPolicy(Protocol):
    name: str

    def on_access(self, key: Key, now: float, size: int, cost: float) -> None:
        """The model was loaded (first call for a key) or served from the cache."""

    def on_evict(self, key: Key) -> None:
        """The model left the device. Unknown keys are ignored."""

    def victims(self) -> Iterator[Key]:
        """Tracked keys, evict-first order. Lazy; the caller must not call on_* while iterating."""

    def sync(self, residents: Iterable[Resident]) -> None:
        """Replace the state with one derived from the records (last_use, hits, load_cost, size)."""

    def __contains__(self, key: Key) -> bool: ...


class LRUPolicy:
    """Least recently used first. State: keys in access order."""

    name = "lru"

    def __init__(self) -> None:
        self._order: OrderedDict[Key, None] = OrderedDict()

    def on_access(self, key: Key, now: float, size: int, cost: float) -> None:
        order = self._order
        if key in order:
            order.move_to_end(key)
        else:
            order[key] = None

    def on_evict(self, key: Key) -> None:
        self._order.pop(key, None)

    def victims(self) -> Iterator[Key]:
        return iter(self._order)

    def sync(self, residents: Iterable[Resident]) -> None:
        self._order = OrderedDict((r.key, None) for r in sorted(residents, key=lambda r: r.last_use))

    def __contains__(self, key: Key) -> bool:
        return key in self._order

    def __len__(self) -> int:
        return len(self._order)


class GDSFPolicy:
    """GreedyDual-Size-Frequency: evict the lowest priority L + frequency * load_cost / size, where L (the
    inflation clock) becomes the priority of each evicted model. Large, cheap to reload, rarely used models
    go first; L ages models that stopped being used. Ties: the least recently accessed goes first.

    State (plain dicts): frequency and priority per key, the clock L, and a heap with stale entries that is
    compacted when it grows past twice the live keys. Frequency restarts at 1 when a model is loaded again.
    """

    name = "gdsf"

    def __init__(self) -> None:
        self.clock = 0.0  # L
        self._freq: dict[Key, int] = {}
        self._prio: dict[Key, float] = {}
        self._stamp: dict[Key, int] = {}  # key -> seq of its live heap entry
        self._heap: list[tuple[float, int, Key]] = []
        self._seq = 0

    def priority(self, key: Key) -> float:
        return self._prio[key]

    def _push(self, key: Key, prio: float) -> None:
        self._seq += 1
        self._prio[key] = prio
        self._stamp[key] = self._seq
        heap = self._heap
        heapq.heappush(heap, (prio, self._seq, key))
        if len(heap) > 2 * len(self._stamp) + 64:
            self._heap = [(self._prio[k], s, k) for k, s in self._stamp.items()]
            heapq.heapify(self._heap)

    def on_access(self, key: Key, now: float, size: int, cost: float) -> None:
        f = self._freq.get(key, 0) + 1
        self._freq[key] = f
        self._push(key, self.clock + f * cost / max(size, 1))

    def on_evict(self, key: Key) -> None:
        p = self._prio.pop(key, None)
        if p is None:
            return
        del self._freq[key], self._stamp[key]
        if p > self.clock:
            self.clock = p

    def victims(self) -> Iterator[Key]:
        heap, stamp = self._heap, self._stamp
        if not heap:
            return
        frontier = [(heap[0], 0)]  # walk the heap in order without popping it
        n = len(heap)
        while frontier:
            (_, seq, key), i = heapq.heappop(frontier)
            if stamp.get(key) == seq:
                yield key
            for c in (2 * i + 1, 2 * i + 2):
                if c < n:
                    heapq.heappush(frontier, (heap[c], c))

    def sync(self, residents: Iterable[Resident]) -> None:
        self._freq, self._prio, self._stamp, self._heap = {}, {}, {}, []
        for r in sorted(residents, key=lambda r: r.last_use):
            self._freq[r.key] = max(r.hits, 1)
            self._push(r.key, self.clock + max(r.hits, 1) * r.load_cost / max(r.size, 1))

    def __contains__(self, key: Key) -> bool:
        return key in self._stamp

    def __len__(self) -> int:
        return len(self._stamp)


POLICIES: dict[str, type] = {"lru": LRUPolicy, "gdsf": GDSFPolicy}
DEFAULT_POLICY = "lru"


def make_policy(name: str = DEFAULT_POLICY) -> EvictionPolicy:
    try:
        return POLICIES[name.lower()]()
    except KeyError:
        raise ValueError(f"unknown eviction policy {name!r}; known: {', '.join(POLICIES)}") from None


def bytes_to_free(used: int, budget: int, high: float = 1.0, low: float = 1.0, incoming: int = 0) -> int:
    """Bytes to evict so that `incoming` more bytes fit. high, low: fractions of budget, low <= high <= 1.
    Once used + incoming passes the high watermark, free down to the low watermark (so that the next loads
    do not evict one model each); below it, nothing. An `incoming` larger than the budget asks for more than
    the device holds: the plan then reports that it cannot free enough."""
    if not 0.0 <= low <= high <= 1.0:
        raise ValueError(f"watermarks need 0 <= low ({low}) <= high ({high}) <= 1")
    total = used + incoming
    if total <= high * budget:
        return 0
    return max(0, int(-(-(total - low * budget) // 1)))  # ceil, in whole bytes


def tenant_usage(residents: Mapping[Key, Resident]) -> dict[str, int]:
    used: dict[str, int] = {}
    for r in residents.values():
        used[r.tenant] = used.get(r.tenant, 0) + r.size
    return used


def plan_eviction(
    policy: EvictionPolicy,
    residents: Mapping[Key, Resident],
    need_bytes: int,
    incoming_tenant: str | None = None,
    shares: Mapping[str, Share] | None = None,
    *,
    incoming_bytes: int = 0,
    tenant_bytes: Mapping[str, int] | None = None,
) -> EvictionPlan:
    """The keys to evict, in order, to free `need_bytes` for a load by `incoming_tenant` of `incoming_bytes`
    (incoming_tenant None: watermark eviction, best effort). Busy and pinned models are never chosen.

    Shares (tenants without an entry: Share()): first, in policy order, models of tenants holding more than
    their guaranteed bytes, while they still do; then, only for watermark eviction or when the incoming
    tenant stays within its own guarantee after the load, models of the other tenants. A tenant whose load
    would pass its maximum evicts only its own models, at least enough to stay within its maximum.
    `tenant_bytes` (bytes per tenant over `residents`) saves a pass when the caller keeps it up to date.
    """
    best_effort = incoming_tenant is None
    if not shares:
        if need_bytes <= 0:
            return EvictionPlan(True)
        out: list[Key] = []
        freed = 0
        for key in policy.victims():
            r = residents.get(key)
            if r is None or r.busy or r.pinned:
                continue
            out.append(key)
            freed += r.size
            if freed >= need_bytes:
                return EvictionPlan(True, tuple(out), freed)
        return _short(out, freed, best_effort, "every other resident model is busy or pinned")

    used = dict(tenant_bytes) if tenant_bytes is not None else tenant_usage(residents)
    none = Share()
    if incoming_tenant is not None:
        own = shares.get(incoming_tenant, none)
        if own.maximum is not None and used.get(incoming_tenant, 0) + incoming_bytes > own.maximum:
            if incoming_bytes > own.maximum:
                return EvictionPlan(False, reason=f"model is larger than tenant {incoming_tenant}'s maximum share")
            need = max(need_bytes, used.get(incoming_tenant, 0) + incoming_bytes - own.maximum)
            out, freed = [], 0
            for key in policy.victims():
                r = residents.get(key)
                if r is None or r.busy or r.pinned or r.tenant != incoming_tenant:
                    continue
                out.append(key)
                freed += r.size
                if freed >= need:
                    return EvictionPlan(True, tuple(out), freed)
            return EvictionPlan(False, reason=f"tenant {incoming_tenant} is at its maximum share and its own "
                                "models are busy or pinned")
    if need_bytes <= 0:
        return EvictionPlan(True)

    out, freed = [], 0
    deferred: list[Resident] = []  # within their guarantee, in policy order
    for key in policy.victims():
        r = residents.get(key)
        if r is None or r.busy or r.pinned:
            continue
        if used.get(r.tenant, 0) > shares.get(r.tenant, none).guaranteed:
            out.append(key)
            freed += r.size
            used[r.tenant] -= r.size
            if freed >= need_bytes:
                return EvictionPlan(True, tuple(out), freed)
        else:
            deferred.append(r)
    if not best_effort and incoming_tenant is not None:
        g = shares.get(incoming_tenant, none).guaranteed
        if used.get(incoming_tenant, 0) + incoming_bytes > g:
            return EvictionPlan(False, reason="the other tenants' models are within their guaranteed shares")
    for r in deferred:
        out.append(r.key)
        freed += r.size
        if freed >= need_bytes:
            return EvictionPlan(True, tuple(out), freed)
    return _short(out, freed, best_effort, "every other resident model is busy, pinned or guaranteed")


def _short(out: list[Key], freed: int, best_effort: bool, reason: str) -> EvictionPlan:
    if best_effort:
        return EvictionPlan(False, tuple(out), freed, reason)
    return EvictionPlan(False, reason=reason)
