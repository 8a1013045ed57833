"""Which Python-lane router process serves each tenant (fast_lane_workers, docs/fast-lane.md "Python-lane
workers"). Pure: rates in, an assignment out; no clock, HAProxy or process inside.

Why: one Python event loop that takes in a noisy tenant's calls makes every other tenant's call on it wait
behind them (docs/execution.md, "the floor of a single-loop Python proxy": 21-22 ms p99 where the bound was
12-13 ms, the same with a proxy that has no logic at all). Reordering inside one loop did not help. Separate
processes do: HAProxy, in front, picks the process by the caller's key.

The rule: lanes are processes 0..n-1 (0 is the router itself, which also serves every other RPC). Tenants are
spread by the greedy longest-first rule: busiest first, each to the lane with the least load so far, ties to
the tenant's current lane, then the lowest. The busiest tenant therefore gets a lane of its own whenever there
are at least two, and light tenants share the others. An assignment is kept until the greedy one would lower
the busiest lane's load by more than `rebalance_ratio`, so tenants do not move back and forth on noise; a
tenant seen for the first time goes to the least loaded lane without moving anyone.
"""

from __future__ import annotations

from collections.abc import Mapping


def lane_loads(rates: Mapping[str, float], assignment: Mapping[str, int], lanes: int) -> list[float]:
    """Requests/s each lane carries under `assignment` (a tenant not in it counts on lane 0)."""
    loads = [0.0] * lanes
    for tenant, rate in rates.items():
        lane = assignment.get(tenant, 0)
        loads[lane if 0 <= lane < lanes else 0] += rate
    return loads


def greedy(rates: Mapping[str, float], lanes: int, current: Mapping[str, int] | None = None) -> dict[str, int]:
    """Longest first: busiest tenant first, each to the least loaded lane (ties: its current lane, then a
    worker's lane before the router's, then the lowest index)."""
    cur = current or {}
    loads = [0.0] * lanes
    out: dict[str, int] = {}
    for tenant in sorted(rates, key=lambda t: (-rates[t], t)):
        here = cur.get(tenant, -1)
        lane = min(range(lanes), key=lambda i: (loads[i], i != here, i == 0, i))
        out[tenant] = lane
        loads[lane] += rates[tenant]
    return out


def assign_lanes(rates: Mapping[str, float], lanes: int, current: Mapping[str, int], *,
                 rebalance_ratio: float = 1.1, min_rate: float = 1.0) -> dict[str, int]:
    """tenant -> lane for the tenants seen in `rates` (requests/s on the Python lane, recent; a tenant HAProxy
    no longer counts is dropped, and starts afresh when it comes back).

    - A tenant seen for the first time goes to the least loaded lane, nobody moving. Every tenant seen counts
      at least `min_rate` there, so a tenant that comes while another is idle for a moment still goes to a lane
      of its own; on a tie a worker's lane comes before the router's own.
    - Tenants under `min_rate` (idle) stay where they are.
    - The others keep their lanes until the longest-first assignment would lower the busiest lane's load by
      more than `rebalance_ratio`; then they take that assignment.
    With one lane, all are on 0."""
    if lanes <= 1:
        return {t: 0 for t in rates}
    weight = {t: max(r, min_rate) for t, r in rates.items()}
    out = {t: lane for t, lane in current.items() if t in rates and 0 <= lane < lanes}
    loads = lane_loads({t: weight[t] for t in out}, out, lanes)
    for tenant in sorted((t for t in rates if t not in out), key=lambda t: (-weight[t], t)):
        lane = min(range(lanes), key=lambda i: (loads[i], i == 0, i))
        out[tenant] = lane
        loads[lane] += weight[tenant]
    busy = {t: r for t, r in rates.items() if r >= min_rate}
    if busy:
        best = greedy(busy, lanes, out)
        if max(lane_loads(busy, out, lanes)) > rebalance_ratio * max(lane_loads(busy, best, lanes)):
            out.update(best)
    return out
