"""Cache-aware placement: which host gets a request for a model. Pure: the router's local view, its own
recent sends and random draws come in, a decision goes out (no clock, no I/O), so sim/ and unit tests drive
exactly this code.

1. Hosts where the model is READY: least outstanding work, by power of two choices.
2. Else a host where it is LOADING (in the view, or a load this router itself just started): wait on it.
3. Else one host to load it: among hosts with room for it (free memory first), the one with the highest
   affinity (rendezvous hash of model key and host address), so that every router picks the same host and
   one load starts, not one per router; when no host has room, the host whose least-recently-used model is
   oldest, then the one with the fewest models, then affinity.

Hot models: when every READY copy has at least `hot_queue_depth` requests waiting or in flight, or the
model's request rate per copy passes `hot_rps_per_copy`, and no further copy is already loading, the
decision also names a host to load another copy on (chosen by rule 3 among the others). Cold copies are let
go by the hosts' own eviction.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum


class Residency(str, Enum):
    READY = "READY"
    LOADING = "LOADING"


class Reason(str, Enum):
    READY = "ready"
    LOADING = "loading"
    LOAD = "load"
    NO_HOST = "no_host"


@dataclass(frozen=True)
class ModelLoad:
    """A model on one host, as the view last saw it."""

    state: Residency
    queue_depth: int = 0
    in_flight: int = 0


@dataclass(frozen=True)
class HostView:
    """One eligible host (up, not draining)."""

    address: str
    free_bytes: int
    models: Mapping[str, ModelLoad] = field(default_factory=dict)
    model_count: int = 0
    lru_last_used: float = float("inf")  # last use (unix s) of its least-recently-used model; inf = holds none
    group: str = ""  # its host group (router/host_groups.py); "" = the shared pool


@dataclass(frozen=True)
class PlacementConfig:
    hot_queue_depth: int = 8  # outstanding requests per READY copy that make a model hot; 0 = off
    hot_rps_per_copy: float = 0.0  # requests/s per READY copy that make a model hot; 0 = off
    min_free_bytes: int = 0  # "room" for a model of unknown size
    pending_ttl_s: float = 30.0  # how long a load this router started counts as LOADING without the view


@dataclass(frozen=True)
class PlacementDecision:
    host: str | None
    reason: Reason
    replicate_to: str | None = None  # start loading another copy here (hot model)


def affinity(key: str, address: str) -> int:
    """Rendezvous weight of a host for a model: stable across processes and routers."""
    return int.from_bytes(hashlib.blake2b(f"{key}|{address}".encode(), digest_size=8).digest(), "big")


def _outstanding(h: HostView, key: str, local: Mapping[str, int]) -> int:
    m = h.models.get(key)
    seen = (m.queue_depth + m.in_flight) if m is not None else 0
    return max(seen, local.get(h.address, 0))  # the view lags; this router's own sends are current


def _two_choices(key: str, hosts: Sequence[HostView], local: Mapping[str, int], draws: tuple[float, float]) -> HostView:
    if len(hosts) == 1:
        return hosts[0]
    i = min(int(draws[0] * len(hosts)), len(hosts) - 1)
    j = min(int(draws[1] * (len(hosts) - 1)), len(hosts) - 2)
    j = j + 1 if j >= i else j
    a, b = hosts[i], hosts[j]
    return min((a, b), key=lambda h: (_outstanding(h, key, local), -affinity(key, h.address)))


def load_target(key: str, hosts: Sequence[HostView], size_bytes: int, cfg: PlacementConfig) -> HostView | None:
    """Rule 3: the host that should load `key`."""
    if not hosts:
        return None
    need = max(size_bytes, cfg.min_free_bytes)
    roomy = [h for h in hosts if h.free_bytes >= need]
    if roomy:
        return max(roomy, key=lambda h: affinity(key, h.address))
    return min(hosts, key=lambda h: (h.lru_last_used, h.model_count, -affinity(key, h.address)))


def _loading_on(key: str, hosts: Sequence[HostView], pending: Mapping[str, float], now: float,
                cfg: PlacementConfig) -> list[HostView]:
    out = []
    for h in hosts:
        m = h.models.get(key)
        if m is not None and m.state is Residency.LOADING:
            out.append(h)
        elif m is None and now - pending.get(h.address, -float("inf")) < cfg.pending_ttl_s:
            out.append(h)
    return out


def place(
    key: str,
    hosts: Sequence[HostView],
    now: float,
    *,
    local_inflight: Mapping[str, int] | None = None,
    pending: Mapping[str, float] | None = None,
    rate: float = 0.0,
    size_bytes: int = 0,
    draws: tuple[float, float] = (0.0, 0.5),
    cfg: PlacementConfig = PlacementConfig(),
) -> PlacementDecision:
    """Where a request for `key` goes. `hosts` are the eligible hosts; `local_inflight` is this router's
    in-flight requests for `key` per host; `pending` the loads of `key` this router started (host -> time
    sent, same clock as `now`); `rate` the model's request rate as this router sees it (requests/s)."""
    local = local_inflight or {}
    pend = pending or {}
    ready = [h for h in hosts if (m := h.models.get(key)) is not None and m.state is Residency.READY]
    loading = _loading_on(key, hosts, pend, now, cfg)
    if ready:
        chosen = _two_choices(key, ready, local, draws)
        replicate = None
        if not loading and _is_hot(key, ready, local, rate, cfg):
            have = {h.address for h in ready}
            target = load_target(key, [h for h in hosts if h.address not in have], size_bytes, cfg)
            replicate = target.address if target is not None else None
        return PlacementDecision(chosen.address, Reason.READY, replicate)
    if loading:
        return PlacementDecision(max(loading, key=lambda h: affinity(key, h.address)).address, Reason.LOADING)
    target = load_target(key, hosts, size_bytes, cfg)
    if target is None:
        return PlacementDecision(None, Reason.NO_HOST)
    return PlacementDecision(target.address, Reason.LOAD)


def _is_hot(key: str, ready: Sequence[HostView], local: Mapping[str, int], rate: float, cfg: PlacementConfig) -> bool:
    if cfg.hot_queue_depth > 0 and min(_outstanding(h, key, local) for h in ready) >= cfg.hot_queue_depth:
        return True
    return cfg.hot_rps_per_copy > 0 and rate / len(ready) >= cfg.hot_rps_per_copy


def placement_config(settings) -> PlacementConfig:
    """The placement knobs of a RouterSettings (ground/settings.py)."""
    return PlacementConfig(hot_queue_depth=settings.hot_queue_depth, hot_rps_per_copy=settings.hot_rps_per_copy,
                           pending_ttl_s=settings.pending_ttl_s)
