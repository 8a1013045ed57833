"""How many CPUs this process may use: the CPUs its affinity mask allows, lowered to a cgroup's CPU limit.

os.cpu_count() counts the machine's CPUs. In a container with a CPU limit (Kubernetes `limits.cpu`, Docker
`--cpus`) the process gets that quota of CPU time and no more, however many CPUs the node has: threads sized
to the node's CPUs then oversubscribe the quota, and the kernel throttles the whole process, its event loop
included. Python 3.11's os module reads neither the mask nor the quota (3.13's process_cpu_count reads the
mask only); HAProxy 2.6 sizes its threads to the mask. Used for hostd's execution plan (slots x intra-op
threads <= these CPUs, hostd/core/sizing.py) and the fast lane's HAProxy threads (fast_lane_threads=0)."""

from __future__ import annotations

import math
import os
from pathlib import Path


def quota_from_cpu_max(text: str) -> float | None:
    """cgroup v2 `cpu.max` ("max 100000", or "150000 100000" for 1.5 CPUs): the CPUs the quota allows, or None
    for no limit."""
    parts = text.split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    return _ratio(parts[0], parts[1])


def quota_from_cfs(quota_us: str, period_us: str) -> float | None:
    """cgroup v1 `cpu.cfs_quota_us` and `cpu.cfs_period_us` (a quota of -1: no limit)."""
    return _ratio(quota_us, period_us)


def _ratio(quota: str, period: str) -> float | None:
    try:
        q, p = int(quota), int(period)
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None


def _text(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def cgroup_quota(root: Path = Path("/sys/fs/cgroup"), proc_cgroup: Path = Path("/proc/self/cgroup")) -> float | None:
    """The lowest CPU quota on this process's cgroup and its parents (v2), or of its cpu controller (v1); None
    when no limit is set or the files cannot be read."""
    lines = (_text(proc_cgroup) or "").splitlines()
    found: list[float] = []
    for line in lines:
        hid, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        parts = Path(path.strip().lstrip("/")).parts
        if hid == "0" and controllers == "":  # v2: a limit on any ancestor applies too
            for depth in range(len(parts), -1, -1):
                q = quota_from_cpu_max(_text(root.joinpath(*parts[:depth], "cpu.max")) or "")
                if q is not None:
                    found.append(q)
        elif "cpu" in controllers.split(","):  # v1; inside a container's namespace the path is the mount's root
            for d in (root.joinpath("cpu", *parts), root / "cpu"):
                q = quota_from_cfs(_text(d / "cpu.cfs_quota_us") or "", _text(d / "cpu.cfs_period_us") or "")
                if q is not None:
                    found.append(q)
                    break
    return min(found) if found else None


def usable_cpus(quota: float | None = None, affinity: int | None = None) -> int:
    """CPUs the process may use at once: its affinity mask's, at most its cgroup quota rounded down (at least
    1). `quota` / `affinity`: given in tests; read from the system when None."""
    if affinity is None:
        affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if quota is None:
        quota = cgroup_quota()
    n = affinity if quota is None else min(affinity, math.floor(quota))
    return max(1, n)
