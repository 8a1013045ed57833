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
import math
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol

Key = Hashable
_LN2 = math.log(2.0)


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


def _heap_order(heap: list[tuple[float, int, Key]], stamp: Mapping[Key, int]) -> Iterator[Key]:
    """The live keys of a heap with stale entries (an entry is live when its seq is the key's stamp), lowest
    first, walking the heap without popping it."""
    if not heap:
        return
    frontier = [(heap[0], 0)]
    n = len(heap)
    while frontier:
        (_, seq, key), i = heapq.heappop(frontier)
        if stamp.get(key) == seq:
            yield key
        for c in (2 * i + 1, 2 * i + 2):
            if c < n:
                heapq.heappush(frontier, (heap[c], c))


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
        return _heap_order(self._heap, self._stamp)

    def sync(self, residents: Iterable[Resident]) -> None:
        self._freq, self._prio, self._stamp, self._heap = {}, {}, {}, []
        for r in sorted(residents, key=lambda r: r.last_use):
            self._freq[r.key] = max(r.hits, 1)
            self._push(r.key, self.clock + max(r.hits, 1) * r.load_cost / max(r.size, 1))

    def __contains__(self, key: Key) -> bool:
        return key in self._stamp

    def __len__(self) -> int:
        return len(self._stamp)


class DecayedGDSFPolicy:
    """"gdsf-decay": GDSF's value, frequency x load cost / size, with a frequency that decays and outlives
    evictions; made for model loading costs.

    Why not plain GDSF: it forgets a model's frequency when it is evicted, so a popular model that lost its
    place comes back at frequency 1 and is the next victim again, and its inflation clock L makes every newly
    loaded model (a cold one included) outrank residents not used for a while. A model cache sees few keys
    (thousands, not millions) and every miss costs seconds, so it can afford what a web cache cannot: a
    decayed request count for every model seen recently, resident or not.

    Value of a model: F x load_cost / size, where F is its exponentially decayed request count (each request
    adds 1; every `half_life` requests F halves; half_life = max(min_half_life, half_life_per_resident x
    residents)). Decay replaces GDSF's clock as the aging: a model that stopped being used loses value at the
    same rate whoever else arrives, and popularity drift fades old counts in a few half-lives. Because every
    count decays at the same rate, the order of two residents never changes between their accesses, so each
    keeps one heap entry: log(F) + log(cost / size) + ln2 x t / half_life at its last access t (t counts
    requests). The evict-first order is the lowest value now. No admission filter: hostd must load every model
    asked for (there is no bypass), but a newly loaded model with little history has a small F and is the
    first victim, so a scan of cold models (a noisy tenant) churns among itself instead of flushing the
    popular ones. History of non-residents whose F decayed below `forget_below` is dropped every half-life.

    Pure: counts requests, never reads a clock (`now` is unused). The half-life is fixed when the policy is
    made from the number of residents then (and re-fixed at each sweep), never per request.
    """

    name = "gdsf-decay"

    def __init__(self, min_half_life: int = 4096, half_life_per_resident: int = 64, forget_below: float = 0.05) -> None:
        self.min_half_life = min_half_life
        self.half_life_per_resident = half_life_per_resident
        self.forget_below = forget_below
        self.half_life = float(min_half_life)
        self.t = 0  # requests seen
        self.history: dict[Key, tuple[float, int]] = {}  # key -> (F at its last access, that access's t)
        self._prio: dict[Key, float] = {}  # resident -> heap priority (log domain)
        self._stamp: dict[Key, int] = {}
        self._heap: list[tuple[float, int, Key]] = []
        self._seq = 0
        self._since_sweep = 0
        self._log_ratio: dict[Key, tuple[int, float, float]] = {}  # resident -> (size, load_cost, log(cost / size))

    def count(self, key: Key) -> float:
        """The key's decayed request count now."""
        h = self.history.get(key)
        return 0.0 if h is None else h[0] * 0.5 ** ((self.t - h[1]) / self.half_life)

    def _push(self, key: Key, prio: float) -> None:
        self._seq += 1
        self._prio[key] = prio
        self._stamp[key] = self._seq
        heapq.heappush(self._heap, (prio, self._seq, key))
        if len(self._heap) > 2 * len(self._stamp) + 64:
            self._heap = [(self._prio[k], s, k) for k, s in self._stamp.items()]
            heapq.heapify(self._heap)

    def _ratio(self, key: Key, size: int, cost: float) -> float:
        """log(cost / size), computed again only when the key's size or cost changed."""
        r = self._log_ratio.get(key)
        if r is None or r[0] != size or r[1] != cost:
            r = self._log_ratio[key] = (size, cost, math.log(max(cost, 1e-9) / max(size, 1)))
        return r[2]

    def _priority(self, key: Key) -> float:
        """log of the value, shifted by the time term so that it stays comparable as time passes."""
        f, at = self.history[key]
        return math.log(f) + self._log_ratio[key][2] + _LN2 * at / self.half_life

    def on_access(self, key: Key, now: float, size: int, cost: float) -> None:
        self.t += 1
        self._since_sweep += 1
        f = 1.0 + self.count(key)
        self.history[key] = (f, self.t)
        self._push(key, math.log(f) + self._ratio(key, size, cost) + _LN2 * self.t / self.half_life)  # = _priority(key)
        if self._since_sweep >= self.half_life:
            self._sweep()

    def _sweep(self) -> None:
        """Every half-life: drop the history of non-residents that faded out, fix the next half-life from
        the number of residents, and restate every count and priority at this time on it (the residents'
        order does not change)."""
        self._since_sweep = 0
        t, residents = self.t, self._stamp
        decayed = {k: self.count(k) for k in self.history}
        self.history = {k: (f, t) for k, f in decayed.items() if f >= self.forget_below or k in residents}
        self.half_life = float(max(self.min_half_life, self.half_life_per_resident * len(residents)))
        keys = list(residents)
        self._heap, self._prio, self._stamp = [], {}, {}
        for k in keys:
            self._push(k, self._priority(k))

    def on_evict(self, key: Key) -> None:
        if self._prio.pop(key, None) is not None:
            del self._stamp[key], self._log_ratio[key]

    def victims(self) -> Iterator[Key]:
        return _heap_order(self._heap, self._stamp)

    def sync(self, residents: Iterable[Resident]) -> None:
        self._prio, self._stamp, self._heap, self._log_ratio = {}, {}, [], {}
        for r in sorted(residents, key=lambda r: r.last_use):
            self.history[r.key] = (max(self.count(r.key), float(max(r.hits, 1))), self.t)
            self._ratio(r.key, r.size, r.load_cost)
            self._push(r.key, self._priority(r.key))

    def __contains__(self, key: Key) -> bool:
        return key in self._stamp

    def __len__(self) -> int:
        return len(self._stamp)


POLICIES: dict[str, type] = {"lru": LRUPolicy, "gdsf": GDSFPolicy, "gdsf-decay": DecayedGDSFPolicy}
DEFAULT_POLICY = "lru"


def make_policy(name: str | EvictionPolicy = DEFAULT_POLICY) -> EvictionPolicy:
    """A new policy by name; a policy object is used as it is (the simulator's reference policies)."""
    if not isinstance(name, str):
        return name
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
