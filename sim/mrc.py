"""Hit-rate curves: hit rate, total load time and shed rate against cache size, per policy, on one workload
(what is often called a miss-ratio curve; the miss ratio is 1 - hit rate). CSV + PNG (matplotlib, Agg).

Pictures (`plot`): three panels on a log cache-size axis (sizes are swept in ratios: 1%, 2%, 5% ...):
hit rate, total load time, shed rate. The knee of each hit-rate curve is a star, its size given in the
legend (labels never overlap). "offline" is the offline bound (Belady's MIN) and is drawn only when it is
exact (every model the same size); with mixed sizes it is "offline~", a size-aware heuristic with knowledge
of the future, labelled as such. A size where most requests were shed (the cache cannot hold the models
asked for) is shaded red in every panel: its load time is low because nothing was loaded, not because it
is good. `plot_latency` draws p99 latency (and shed) against cache size from the full engine.

Knee: the Kneedle point in bytes (not on the log axis: memory is bought by the byte), the size where the
normalised hit-rate curve lies farthest above the straight line from its first to its last point (past it,
each more GB buys less and less).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from sim.cache_only import run_cache_only
from sim.costs import CostModel
from sim.offline import run_offline
from sim.stats import SimResult
from sim.workload import Workload

COLUMNS = ("policy", "cache_fraction", "cache_bytes", "hit_rate", "byte_miss_rate", "loads", "load_s", "shed_rate",
           "knee", "p50_ms", "p99_ms", "latency_shed_rate")
MOSTLY_SHED = 0.5  # a configuration that sheds at least this share of requests is flagged everywhere
SOME_SHED = 0.01  # ringed in red in the pictures: its load time counts only the models it could load
Latency = Callable[[str, int], SimResult]  # (policy, cache bytes) -> a full-engine run


def run_policy(wl: Workload, cache_bytes: int, policy: str, costs: CostModel | None = None, **kw) -> SimResult:
    """One cache-only run; policy "offline" is the offline bound (MIN) when sizes are equal, else the
    heuristic "offline~" (sim/offline.py)."""
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
    latency: Latency | None = None,
    **kw,
) -> list[dict]:
    """Rows (COLUMNS) for every policy x cache size (a fraction of the workload's total model bytes). The
    row's policy is the result's name ("offline~" for the heuristic). `latency`: also run the full engine
    for every online policy and size (p50, p99 and its shed rate; NaN otherwise)."""
    total = wl.total_bytes
    fractions = sorted(fractions)
    rows: list[dict] = []
    nan = float("nan")
    for policy in policies:
        mine = []
        for f in fractions:
            size = max(int(total * f), 1)
            res = run_policy(wl, size, policy, costs, **kw)
            r = res.row()
            row = {"policy": res.policy, "cache_fraction": f, "cache_bytes": size, "hit_rate": r["hit_rate"],
                   "byte_miss_rate": r["byte_miss_rate"], "loads": r["loads"], "load_s": r["load_s"],
                   "shed_rate": r["shed_rate"], "knee": False, "p50_ms": nan, "p99_ms": nan,
                   "latency_shed_rate": nan}
            if latency is not None and policy != "offline":
                lr = latency(policy, size).row()
                row.update(p50_ms=lr["p50_ms"], p99_ms=lr["p99_ms"], latency_shed_rate=lr["shed_rate"])
            mine.append(row)
            if on_point is not None:
                on_point(row)
        k = knee_index([r["cache_bytes"] for r in mine], [r["hit_rate"] for r in mine])
        if k is not None:
            mine[k]["knee"] = True
        rows.extend(mine)
    return rows


def shed_warnings(rows: Iterable[dict], largest_model: int = 0, key: str = "shed_rate") -> list[str]:
    """One loud line per policy that sheds most requests (MOSTLY_SHED or more) at some cache size."""
    bad: dict[str, list[dict]] = {}
    for r in rows:
        s = r.get(key, 0.0)
        if isinstance(s, float) and not math.isnan(s) and s >= MOSTLY_SHED:
            bad.setdefault(r["policy"], []).append(r)
    out = []
    for policy, rs in bad.items():
        top = max(rs, key=lambda r: r["cache_bytes"])
        shed = max(r[key] for r in rs)
        sizes = (f"a {human_bytes(top['cache_bytes'])} cache" if len(rs) == 1
                 else f"{len(rs)} cache sizes up to {human_bytes(top['cache_bytes'])}")
        why = (f": smaller than the largest model ({human_bytes(largest_model)})"
               if largest_model and top["cache_bytes"] < largest_model else "")
        out.append(f"WARNING: {policy} sheds most requests (up to {shed:.0%}) with {sizes}{why}; there, its other "
                   f"figures describe only the requests it served")
    return out


def write_csv(rows: list[dict], path: str | Path) -> Path:
    path = Path(path)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({c: r.get(c, "") for c in COLUMNS})
    return path


def human_bytes(n: float) -> str:
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= div:
            return f"{n / div:,.4g} {unit}"
    return f"{n:.0f} B"


def _unit(rows: list[dict]) -> tuple[float, str]:
    top = max(r["cache_bytes"] for r in rows)
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if top >= 10 * div:
            return div, unit
    return 1.0, "B"


def _label(policy: str) -> str:
    if policy == "offline":
        return "offline (bound)"
    if policy == "offline~":
        return "offline~ (heuristic, not a bound)"
    return policy


def _style(policy: str) -> dict:
    if policy == "offline":
        return {"linestyle": "--", "color": "black"}
    if policy == "offline~":
        return {"linestyle": ":", "color": "gray"}
    return {"linestyle": "-"}


def _shade_shed(axes, rows: list[dict], div: float, key: str) -> bool:
    """Shade the sizes where any policy shed most requests, each band reaching halfway (on the log axis) to
    its neighbours, so that neighbouring shed sizes make one band; True when there were some."""
    every = sorted({r["cache_bytes"] / div for r in rows})
    shed = {r["cache_bytes"] / div for r in rows
            if isinstance(r.get(key), float) and not math.isnan(r[key]) and r[key] >= MOSTLY_SHED}
    for i, x in enumerate(every):
        if x not in shed:
            continue
        left = math.sqrt(every[i - 1] * x) if i > 0 else x / 1.15
        right = math.sqrt(every[i + 1] * x) if i + 1 < len(every) else x * 1.15
        for ax in axes:
            ax.axvspan(left, right, color="red", alpha=0.15, lw=0)
    return bool(shed)


def _colors(rows: list[dict]) -> dict[str, str]:
    """One color per online policy, the same in every picture of one sweep."""
    online = [p for p in dict.fromkeys(r["policy"] for r in rows) if not p.startswith("offline")]
    return {p: f"C{i}" for i, p in enumerate(online)}


def _mpl():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _plain(ax, y: bool = False) -> None:
    """Log axes with plain numbers (0.1, 1, 10), not powers of ten; a log y axis is labelled at 1, 2 and 5
    of each decade, so that a range within one decade still has labels."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    fmt = FuncFormatter(lambda v, _: f"{v:,.10g}")
    ax.xaxis.set_major_formatter(fmt)
    if y:
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(fmt)
        ax.yaxis.set_minor_formatter(NullFormatter())


def plot(rows: list[dict], path: str | Path, title: str = "") -> Path:
    """Hit rate, load time and shed rate against cache size (log axis), one line per policy."""
    plt = _mpl()
    from matplotlib.patches import Patch

    path = Path(path)
    div, unit = _unit(rows)
    fig, (ax_hit, ax_load, ax_shed) = plt.subplots(1, 3, figsize=(15, 4.6))
    colors = _colors(rows)
    for policy in dict.fromkeys(r["policy"] for r in rows):
        mine = [r for r in rows if r["policy"] == policy]
        xs = [r["cache_bytes"] / div for r in mine]
        knee = next((r for r in mine if r["knee"]), None)
        label = _label(policy) + (f", knee {human_bytes(knee['cache_bytes'])}" if knee else "")
        st = {"color": colors.get(policy), **_style(policy)}
        ax_hit.plot(xs, [r["hit_rate"] for r in mine], marker="o", ms=3, label=label, **st)
        color = st["color"]
        # load time where most was shed is left out: nothing loaded there, which is not a good cache
        ax_load.plot(xs, [r["load_s"] if r["shed_rate"] < MOSTLY_SHED else math.nan for r in mine], marker="o",
                     ms=3, label=_label(policy), **st)
        ax_shed.plot(xs, [r["shed_rate"] for r in mine], marker="o", ms=3, label=_label(policy), **st)
        if knee is not None:
            ax_hit.plot([knee["cache_bytes"] / div], [knee["hit_rate"]], "*", ms=14, color=color)
        some = [r for r in mine if SOME_SHED <= r["shed_rate"] < MOSTLY_SHED]
        ax_load.plot([r["cache_bytes"] / div for r in some], [r["load_s"] for r in some], "o", ms=10, mfc="none",
                     mec="red", mew=1.5)
    shaded = _shade_shed((ax_hit, ax_load, ax_shed), rows, div, "shed_rate")
    if any(SOME_SHED <= r["shed_rate"] < MOSTLY_SHED for r in rows):
        ax_load.text(0.02, 0.02, "red ring: some requests shed (not loaded),\nso this load time is flattered",
                     transform=ax_load.transAxes, fontsize=8, color="darkred", va="bottom")
    ax_hit.set(ylabel="hit rate (1 - miss ratio)", title="hit rate (higher is better; knee: *)", ylim=(0, 1.02))
    ax_load.set(ylabel="total load time (s)", title="model load time (lower is better)")
    ax_shed.set(ylabel="share of requests shed", title="shed (the cache could not take the model)", ylim=(-0.02, 1.02))
    for ax in (ax_hit, ax_load, ax_shed):
        ax.set_xscale("log")
        ax.set_xlabel(f"cache size ({unit}, log scale)")
        ax.grid(alpha=0.3, which="both")
    handles, labels = ax_hit.get_legend_handles_labels()
    if shaded:
        handles.append(Patch(color="red", alpha=0.15))
        labels.append(f"most requests shed (>= {MOSTLY_SHED:.0%})")
    for ax in (ax_hit, ax_load, ax_shed):
        _plain(ax)
    # one legend for the three panels, under them: it never covers a curve
    return _finish(fig, handles, labels, title, path)


def plot_latency(rows: list[dict], path: str | Path, title: str = "") -> Path:
    """p99 latency and shed rate against cache size (full engine), one line per policy."""
    plt = _mpl()
    path = Path(path)
    rows = [r for r in rows if not math.isnan(r["p99_ms"]) or not math.isnan(r["latency_shed_rate"])]
    if not rows:
        raise ValueError("no latency in these rows (sweep with latency=...)")
    div, unit = _unit(rows)
    fig, (ax_p99, ax_shed) = plt.subplots(1, 2, figsize=(11, 4.4))
    colors = _colors(rows)
    for policy in dict.fromkeys(r["policy"] for r in rows):
        mine = [r for r in rows if r["policy"] == policy]
        xs = [r["cache_bytes"] / div for r in mine]
        st = {"color": colors.get(policy), **_style(policy)}
        ax_p99.plot(xs, [r["p99_ms"] if r["latency_shed_rate"] < MOSTLY_SHED else math.nan for r in mine],
                    marker="o", ms=3, label=_label(policy), **st)
        some = [r for r in mine if SOME_SHED <= r["latency_shed_rate"] < MOSTLY_SHED]
        ax_p99.plot([r["cache_bytes"] / div for r in some], [r["p99_ms"] for r in some], "o", ms=10, mfc="none",
                    mec="red", mew=1.5)
        ax_shed.plot(xs, [r["latency_shed_rate"] for r in mine], marker="o", ms=3, label=_label(policy), **st)
    shaded = _shade_shed((ax_p99, ax_shed), rows, div, "latency_shed_rate")
    p99 = [r["p99_ms"] for r in rows  # the points drawn
           if not math.isnan(r["p99_ms"]) and r["p99_ms"] > 0 and r["latency_shed_rate"] < MOSTLY_SHED]
    wide = bool(p99) and max(p99) > 20 * min(p99)  # a log scale only where it spans decades
    ax_p99.set(ylabel="p99 latency (ms" + (", log scale)" if wide else ")"),
               title="p99 latency of served requests (lower is better)", yscale="log" if wide else "linear")
    ax_shed.set(ylabel="share of requests shed", title="shed", ylim=(-0.02, 1.02))
    for ax in (ax_p99, ax_shed):
        ax.set_xscale("log")
        ax.set_xlabel(f"cache size ({unit}, log scale)")
        ax.grid(alpha=0.3, which="both")
    _plain(ax_p99, y=wide)
    if any(SOME_SHED <= r["latency_shed_rate"] < MOSTLY_SHED for r in rows):
        ax_p99.text(0.02, 0.02, "red ring: some requests shed, so this p99\ncounts only the requests served",
                    transform=ax_p99.transAxes, fontsize=8, color="darkred", va="bottom")
    _plain(ax_shed)
    handles, labels = ax_p99.get_legend_handles_labels()
    if shaded:
        from matplotlib.patches import Patch

        handles.append(Patch(color="red", alpha=0.15))
        labels.append(f"most requests shed (>= {MOSTLY_SHED:.0%}): p99 not drawn")
    return _finish(fig, handles, labels, title, path)


def _finish(fig, handles, labels, title, path):
    """The legend under the panels (it never covers a curve), the title, the file."""
    import matplotlib.pyplot as plt

    fig.legend(handles, labels, fontsize=9, loc="lower center", ncol=min(len(labels), 4), frameon=False)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
