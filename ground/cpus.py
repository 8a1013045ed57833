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
    quota, period = int(parts[0]), int(parts[1])
    return quota / period if quota > 0 and period > 0 else None


def quota_from_cfs(quota_us: str, period_us: str) -> float | None:
    """cgroup v1 `cpu.cfs_quota_us` and `cpu.cfs_period_us` (a quota of -1: no limit)."""
    quota, period = int(quota_us), int(period_us)
    return quota / period if quota > 0 and period > 0 else None


def cgroup_quota(root: Path = Path("/sys/fs/cgroup"), proc_cgroup: Path = Path("/proc/self/cgroup")) -> float | None:
    """The lowest CPU quota on this process's cgroup and its parents (v2), or of its cpu controller (v1); None
    when no limit is set or the files cannot be read."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    found: list[float] = []
    for line in lines:
        hid, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        rel = path.strip().lstrip("/")
        if hid == "0" and controllers == "":  # v2: a limit on any ancestor applies too
            here = root / rel
            while True:
                q = _read(lambda d=here: quota_from_cpu_max((d / "cpu.max").read_text()))
                if q is not None:
                    found.append(q)
                if here == root or root not in here.parents:
                    break
                here = here.parent
        elif "cpu" in controllers.split(","):  # v1
            for d in (root / "cpu" / rel, root / "cpu"):  # inside a container's namespace the path is its root
                q = _read(lambda d=d: quota_from_cfs((d / "cpu.cfs_quota_us").read_text(),
                                                     (d / "cpu.cfs_period_us").read_text()))
                if q is not None:
                    found.append(q)
                    break
    return min(found) if found else None


def _read(f) -> float | None:
    try:
        return f()
    except (OSError, ValueError):
        return None


def usable_cpus(quota: float | None = None, affinity: int | None = None) -> int:
    """CPUs the process may use at once: its affinity mask's, at most its cgroup quota rounded down (at least
    1). `quota` / `affinity`: given in tests; read from the system when None."""
    if affinity is None:
        affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if quota is None:
        quota = cgroup_quota()
    n = affinity if quota is None else min(affinity, math.floor(quota))
    return max(1, n)
