"""The router's real placement policy as the full engine's placement hook.

`RouterPlacement` builds `router.placement_policy.HostView`s from the simulated hosts at each arrival and
calls `router.placement_policy.place`, the function the router itself calls; this router's own state
(requests in flight per host, loads it started, each model's rate) is `router.local_load.LocalLoad`, the
router's own class. What differs from a real router: the view is current (a real router's is refreshed every
`refresh_interval_s`), and the random draws come from a seeded generator, so a run is reproducible. A retry
(ClusterConfig.attempts) calls the hook again with the hosts tried excluded from the view, as the router's
dispatcher does (router/dispatcher.py). Host groups (router/host_groups.py): `groups` is the router's
host_groups map, `host_groups` the group of each simulated host by index (missing = the shared pool); a
model is placed only on hosts of its group, by the router's own functions.

    hook = RouterPlacement(PlacementConfig(), seed=0)
    run_cluster(wl, ClusterConfig(hosts=2, ...), costs, placement=hook)
"""

from __future__ import annotations

import random
from collections.abc import Collection, Mapping, Sequence

from router.host_groups import SHARED, group_of_key, in_group
from router.local_load import LocalLoad
from router.placement_policy import HostView, ModelLoad, PlacementConfig, Reason, Residency, place
from hostd.core.lifecycle import ModelState
from sim.cluster import Cluster, SimHost


def host_address(index: int) -> str:
    return f"sim-host-{index}"


def host_index(address: str) -> int:
    return int(address.rsplit("-", 1)[1])


def host_view(host: SimHost, cluster: Cluster, group: str = SHARED) -> HostView:
    """What a router would see of one simulated host: its models READY or LOADING with their queue depth
    and requests running, free bytes under the budget, model count and the oldest last use of a READY one."""
    models: dict[str, ModelLoad] = {}
    lru = float("inf")
    for m, hm in host.models.items():
        key = cluster.wl.models[m].key
        ready = hm.state is ModelState.READY
        models[key] = ModelLoad(Residency.READY if ready else Residency.LOADING, len(hm.queue), hm.queue.running)
        if ready:
            lru = min(lru, host.cache.residents[m].last_use)
    return HostView(host_address(host.index), max(0, host.free_bytes), models, len(models), lru, group)


class RouterPlacement:
    """A placement hook for sim.cluster.Cluster that decides with the router's `place`."""

    def __init__(self, cfg: PlacementConfig | None = None, seed: int = 0, known_sizes: bool = False,
                 groups: Mapping[str, str] | None = None, host_groups: Sequence[str] = ()) -> None:
        """`known_sizes`: pass each model's size to the policy even before any host holds it (a real router
        learns a size only from a host reporting the model READY; that is the default here too). `groups`,
        `host_groups`: see the module's docstring."""
        self.cfg = cfg or PlacementConfig()
        self.rng = random.Random(seed)
        self.local = LocalLoad()
        self.known_sizes = known_sizes
        self.decisions: dict[str, int] = {r.value: 0 for r in Reason}
        self.replications = 0
        self._last_sweep = float("-inf")
        self.groups = dict(groups or {})
        self.host_groups = tuple(host_groups)

    def _group(self, index: int) -> str:
        return self.host_groups[index] if index < len(self.host_groups) else SHARED

    def __call__(self, m: int, now: float, cluster: Cluster, exclude: Collection[int] = ()) -> int | None:
        """The host for a request for model `m`; None when `exclude` leaves no host (a retry with none left)."""
        spec = cluster.wl.models[m]
        key = spec.key
        group = group_of_key(self.groups, key)
        views = in_group([host_view(h, cluster, self._group(h.index)) for h in cluster.hosts if h.index not in exclude],
                         group)
        ready_somewhere = any(m in h.models and h.models[m].state is ModelState.READY for h in cluster.hosts)
        size = spec.size if (self.known_sizes or ready_somewhere) else 0
        inflight = {host_address(h.index): len(h.models[m].queue) + h.models[m].queue.running
                    for h in cluster.hosts if m in h.models}
        p = place(key, views, now, local_inflight=inflight, pending=self.local.pending_for(key),
                  rate=self.local.hit(key, now), size_bytes=size,
                  draws=(self.rng.random(), self.rng.random()), cfg=self.cfg)
        if p.host is None:  # no eligible host: only when every host is excluded (the router's no_host)
            if exclude:
                return None
            raise RuntimeError(f"placement found no host for {key}" + (f" in host group {group!r}" if group else ""))
        self.decisions[p.reason.value] += 1
        if p.reason is Reason.LOAD:
            self.local.started_load(key, p.host, now)
        if p.replicate_to is not None and cluster.start_copy(host_index(p.replicate_to), m, now):
            self.local.started_load(key, p.replicate_to, now)
            self.replications += 1
        if now - self._last_sweep >= 1.0:
            self.local.sweep(now, self.cfg.pending_ttl_s)
            self._last_sweep = now
        return host_index(p.host)
