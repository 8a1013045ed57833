"""Miss-ratio curves: hit rate and total load time against cache size, per policy, on one workload.
CSV + PNG (matplotlib, Agg backend), with the knee of each hit-rate curve marked.

Knee: the Kneedle point, the size where the normalised hit-rate curve lies farthest above the straight
line from its first to its last point (past it, more memory buys less and less).
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from sim.cache_only import run_cache_only
from sim.costs import CostModel
from sim.offline import run_offline
from sim.stats import SimResult
from sim.workload import Workload

COLUMNS = ("policy", "cache_fraction", "cache_bytes", "hit_rate", "byte_miss_rate", "loads", "load_s", "knee")


def run_policy(wl: Workload, cache_bytes: int, policy: str, costs: CostModel | None = None, **kw) -> SimResult:
    """One cache-only run; policy "offline" is the offline bound (estimate for mixed sizes)."""
    if policy == "offline":
        return run_offline(wl, cache_bytes, costs, host_ram_bytes=kw.get("host_ram_bytes", 0))
    return run_cache_only(wl, cache_bytes, policy, costs, **kw)


def knee_index(xs: Sequence[float], ys: Sequence[float]) -> int | None:
    if len(xs) < 3:
        return None
    x0, x1, y0, y1 = xs[0], xs[-1], min(ys), max(ys)
    if x1 == x0 or y1 == y0:
        return None
    diff = [(y - y0) / (y1 - y0) - (x - x0) / (x1 - x0) for x, y in zip(xs, ys, strict=True)]
    best = max(range(len(diff)), key=diff.__getitem__)
    return best if diff[best] > 0 else None


def sweep(
    wl: Workload,
    fractions: Iterable[float],
    policies: Iterable[str] = ("lru", "gdsf", "offline"),
    costs: CostModel | None = None,
    on_point: Callable[[dict], None] | None = None,
    **kw,
) -> list[dict]:
    """Rows (COLUMNS) for every policy x cache size (a fraction of the workload's total model bytes)."""
    total = wl.total_bytes
    fractions = sorted(fractions)
    rows: list[dict] = []
    for policy in policies:
        mine = []
        for f in fractions:
            r = run_policy(wl, int(total * f), policy, costs, **kw).row()
            row = {"policy": policy, "cache_fraction": f, "cache_bytes": int(total * f), "hit_rate": r["hit_rate"],
                   "byte_miss_rate": r["byte_miss_rate"], "loads": r["loads"], "load_s": r["load_s"], "knee": False}
            mine.append(row)
            if on_point is not None:
                on_point(row)
        k = knee_index([r["cache_bytes"] for r in mine], [r["hit_rate"] for r in mine])
        if k is not None:
            mine[k]["knee"] = True
        rows.extend(mine)
    return rows


def write_csv(rows: list[dict], path: str | Path) -> Path:
    path = Path(path)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({c: r[c] for c in COLUMNS})
    return path


def plot(rows: list[dict], path: str | Path, title: str = "") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    fig, (ax_hit, ax_load) = plt.subplots(1, 2, figsize=(11, 4.2))
    for policy in dict.fromkeys(r["policy"] for r in rows):
        mine = [r for r in rows if r["policy"] == policy]
        gb = [r["cache_bytes"] / 1e9 for r in mine]
        style = "--" if policy == "offline" else "-"
        (line,) = ax_hit.plot(gb, [r["hit_rate"] for r in mine], style, marker="o", ms=3, label=policy)
        ax_load.plot(gb, [r["load_s"] for r in mine], style, marker="o", ms=3, color=line.get_color(), label=policy)
        for r, x in zip(mine, gb, strict=True):
            if r["knee"]:
                ax_hit.plot([x], [r["hit_rate"]], "*", ms=14, color=line.get_color())
                ax_hit.annotate(f"knee {x:.2f} GB", (x, r["hit_rate"]), textcoords="offset points", xytext=(6, -12),
                                fontsize=8, color=line.get_color())
    ax_hit.set(xlabel="cache size (GB)", ylabel="hit rate", title="hit rate (knee: *)")
    ax_load.set(xlabel="cache size (GB)", ylabel="total load time (s)", title="load time")
    for ax in (ax_hit, ax_load):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
