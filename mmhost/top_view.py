"""What `mmhost top` shows, from two snapshots of the cluster's HostStatus messages: hosts, resident models,
device-tier hit rate and shed rates by tenant (from the deltas of the hosts' counters between snapshots).
No I/O and no clock: snapshots carry their time; rendering returns rich renderables."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from rich.console import Group
from rich.table import Table
from rich.text import Text

from protos import hostd_control_pb2 as hc


@dataclass(frozen=True)
class Snapshot:
    at: float  # seconds, any monotonic clock
    hosts: dict[str, hc.HostStatus | None]  # address -> status (None: did not answer)
    source: str = ""


@dataclass
class Rates:
    hit_rate_total: float | None  # device-tier hits / lookups since the hosts started
    hit_rate_recent: float | None  # ... between the two snapshots
    shed_total: dict[str, int] = field(default_factory=dict)  # tenant -> sheds since start (all hosts)
    shed_per_s: dict[str, float] = field(default_factory=dict)  # tenant -> sheds/s between snapshots
    requests_per_s: dict[str, float] = field(default_factory=dict)  # tenant -> requests/s between snapshots
    requests_total: dict[str, int] = field(default_factory=dict)  # tenant -> requests since start (all hosts)


def _sum_by_tenant(snap: Snapshot, attr: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for s in snap.hosts.values():
        if s is None:
            continue
        for t, n in getattr(s, attr).items():
            out[t] = out.get(t, 0) + n
    return out


def _hits(snap: Snapshot) -> tuple[int, int]:
    hits = sum(s.cache_hits for s in snap.hosts.values() if s is not None)
    misses = sum(s.cache_misses for s in snap.hosts.values() if s is not None)
    return hits, misses


def _delta(cur: dict[str, int], prev: dict[str, int]) -> dict[str, int]:
    # a host that restarted has smaller counters: count from zero rather than negative
    return {t: (n - prev.get(t, 0)) if n >= prev.get(t, 0) else n for t, n in cur.items()}


def rates(cur: Snapshot, prev: Snapshot | None) -> Rates:
    hits, misses = _hits(cur)
    total = hits / (hits + misses) if hits + misses else None
    shed = _sum_by_tenant(cur, "shed_by_tenant")
    reqs = _sum_by_tenant(cur, "requests_by_tenant")
    out = Rates(total, None, shed, requests_total=reqs)
    if prev is None or cur.at <= prev.at:
        return out
    dt = cur.at - prev.at
    dh = dm = 0
    for addr, s in cur.hosts.items():
        p = prev.hosts.get(addr)
        if s is None:
            continue
        if p is None or s.cache_hits < p.cache_hits or s.cache_misses < p.cache_misses:  # new or restarted
            dh, dm = dh + s.cache_hits, dm + s.cache_misses
        else:
            dh, dm = dh + s.cache_hits - p.cache_hits, dm + s.cache_misses - p.cache_misses
    out.hit_rate_recent = dh / (dh + dm) if dh + dm else None
    out.shed_per_s = {t: n / dt for t, n in _delta(shed, _sum_by_tenant(prev, "shed_by_tenant")).items()}
    out.requests_per_s = {t: n / dt for t, n in _delta(reqs, _sum_by_tenant(prev, "requests_by_tenant")).items()}
    return out


def _mib(n: int) -> str:
    return f"{n / (1 << 20):,.0f} MiB"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def hosts_table(snap: Snapshot) -> Table:
    t = Table(title="hosts", title_justify="left", expand=False)
    for c in ("address", "device", "memory used / budget", "slots busy/total", "waiting", "models", "req total",
              "state"):
        t.add_column(c, justify="right" if c not in ("address", "device", "state") else "left")
    for addr, s in sorted(snap.hosts.items()):
        if s is None:
            t.add_row(addr, "-", "-", "-", "-", "-", "-", Text("DOWN", style="bold red"))
            continue
        resident = sum(1 for m in s.models if m.state == "READY")
        state = Text("DRAINING", style="yellow") if s.draining else Text("UP", style="green")
        t.add_row(addr, s.device or "-", f"{_mib(s.device_memory_used)} / {_mib(s.device_memory_budget)}",
                  f"{s.slots_busy}/{s.execution_slots}", str(s.slots_waiting), str(resident), str(s.requests_total),
                  state)
    return t


def models_table(snap: Snapshot, limit: int = 50) -> Table:
    t = Table(title="models", title_justify="left")
    for c in ("host", "tenant", "model", "ver", "state", "memory", "inst", "queue", "in flight", "queue ms",
              "compute ms", "req/s", "shed"):
        t.add_column(c, justify="left" if c in ("host", "tenant", "model", "ver", "state") else "right")
    rows = []
    for addr, s in snap.hosts.items():
        if s is None:
            continue
        for m in s.models:
            rows.append((addr, m))
    rows.sort(key=lambda r: (-(r[1].queue_depth + r[1].in_flight), -r[1].requests_per_s, r[0], r[1].tenant,
                             r[1].model))
    for addr, m in rows[:limit]:
        t.add_row(addr, m.tenant, m.model, m.version, m.state + (" (pinned)" if m.pinned else ""),
                  _mib(m.memory_bytes) if m.memory_bytes else "-", str(m.instances), str(m.queue_depth),
                  str(m.in_flight), f"{m.queue_ms_recent:.1f}", f"{m.compute_ms_recent:.1f}",
                  f"{m.requests_per_s:.1f}", str(m.shed_total))
    if len(rows) > limit:
        t.caption = f"{len(rows) - limit} more not shown (busiest first)"
    return t


def tenants_table(r: Rates) -> Table:
    t = Table(title="tenants (requests and sheds on hostds)", title_justify="left")
    for c in ("tenant", "req/s", "shed/s", "req total", "shed total"):
        t.add_column(c, justify="left" if c == "tenant" else "right")
    tenants = sorted(set(r.shed_total) | set(r.requests_total), key=lambda x: (-r.shed_per_s.get(x, 0.0), x))
    for tenant in tenants:
        sps = r.shed_per_s.get(tenant)
        t.add_row(tenant, "-" if tenant not in r.requests_per_s else f"{r.requests_per_s[tenant]:.1f}",
                  "-" if sps is None else Text(f"{sps:.1f}", style="bold red" if sps > 0 else ""),
                  str(r.requests_total.get(tenant, 0)), str(r.shed_total.get(tenant, 0)))
    return t


def render(cur: Snapshot, prev: Snapshot | None, *, model_limit: int = 50) -> Group:
    r = rates(cur, prev)
    up = sum(1 for s in cur.hosts.values() if s is not None and not s.draining)
    head = Text.assemble(
        ("mmhost top", "bold"), f"  {cur.source}  hosts up {up}/{len(cur.hosts)}  ",
        "device-tier hit rate: ", (_pct(r.hit_rate_recent), "bold"), " recent, ", _pct(r.hit_rate_total),
        " since start",
    )
    return Group(head, hosts_table(cur), models_table(cur, model_limit), tenants_table(r))


def down_hosts(snap: Snapshot) -> Sequence[str]:
    return [a for a, s in snap.hosts.items() if s is None]
