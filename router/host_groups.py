"""Host groups: dedicated pools of hosts for chosen tenants or models. Pure: the operator's map and the hosts'
views come in, the hosts a model may be placed on go out (no clock, no I/O).

Why: a hostd is one process, one event loop and one GIL for every model it serves. Beside a saturating
model, a light model's requests wait behind the saturating model's in that loop, whatever the slots and
queues inside it decide (docs/execution.md measures it: the light model's own queue time stays 0.02 ms while
its p99 grows 5-8x). Two hostds on one device share nothing but the cores, the device and the kernel, and a
light model beside a noisy one in another process is answered at the cores' floor. Groups are how an
operator says which models get which processes: run a hostd with `host_group = "bulk"` next to the shared
one (each with its part of the device's memory, `device_memory`), and map the noisy tenant, or one tenant's
noisy model, to "bulk" (RouterSettings.host_groups).

Rules:
- A model's group is the map's entry for `tenant/model`, else for `tenant`, else "" (the shared pool).
- A model is placed only on hosts of its group: loads, extra copies of a hot model, and requests (a copy an
  operator loaded on a host of another group is not sent requests). Strict on purpose: a dedicated pool
  that quietly overflowed into the shared one would bring back the starvation it was made to stop, and a
  shared-pool model in a dedicated pool would take the capacity its owner pays for. A group with no host up
  answers UNAVAILABLE (no_host), as an empty cluster does, and the router logs which group it was.
- Calls that are not placements (repository index, statistics, unloads) still reach every host.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from router.placement_policy import HostView

SHARED = ""


def group_of(groups: Mapping[str, str], tenant: str, model: str) -> str:
    """The group a tenant's model is placed in: `tenant/model`'s entry, else `tenant`'s, else the shared pool."""
    if not groups:
        return SHARED
    g = groups.get(f"{tenant}/{model}")
    return g if g is not None else groups.get(tenant, SHARED)


def in_group(hosts: Sequence[HostView], group: str) -> list[HostView]:
    """The hosts of `group`, in their order."""
    return [h for h in hosts if h.group == group]


def group_of_key(groups: Mapping[str, str], key: str) -> str:
    """group_of for a model key 'tenant/model' or 'tenant/model/version' (router.cluster.model_key)."""
    tenant, _, rest = key.partition("/")
    return group_of(groups, tenant, rest.partition("/")[0])


def hosts_per_group(hosts: Sequence[HostView], groups: Mapping[str, str]) -> dict[str, int]:
    """Up hosts per group: every group the map names, the shared pool, and any group a host reports."""
    out = {g: 0 for g in {SHARED, *groups.values()}}
    for h in hosts:
        out[h.group] = out.get(h.group, 0) + 1
    return out
