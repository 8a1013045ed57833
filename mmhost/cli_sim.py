"""`mmhost sim`: run the simulator (sim/) on a synthetic workload or a recorded trace, compare policies,
sweep cache sizes. Prints rich tables; writes CSV, JSON and PNG to --out."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

sim_app = typer.Typer(no_args_is_help=True, help="Simulate cache size, eviction policy and batching choices.")

ConfigOpt = Annotated[Path | None, typer.Option("--config", "-c", help="YAML or JSON config; flags override")]
TraceOpt = Annotated[list[Path] | None, typer.Option("--trace", help="replay a router access log (JSON lines; other "
                                                     "lines and non-OK requests are skipped and counted); repeat it "
                                                     "for several (routers, their workers' FILE.wN): merged by time")]
SizesFromOpt = Annotated[str | None, typer.Option("--sizes-from", help="with --trace: model sizes from this model "
                                                  "store (folder, file:// or s3://) instead of the log's size_bytes")]
ModelsOpt = Annotated[int | None, typer.Option("--models", help="synthetic: number of models")]
RequestsOpt = Annotated[int | None, typer.Option("--requests", help="synthetic: number of requests")]
TenantsOpt = Annotated[int | None, typer.Option("--tenants", help="synthetic: number of tenants")]
ZipfOpt = Annotated[float | None, typer.Option("--zipf", help="synthetic: popularity exponent")]
SizeOpt = Annotated[float | None, typer.Option("--size-median", help="synthetic: median model bytes")]
SigmaOpt = Annotated[float | None, typer.Option("--size-sigma", help="synthetic: lognormal sigma")]
RateOpt = Annotated[float | None, typer.Option("--rate", help="synthetic: requests per second")]
ArrOpt = Annotated[str | None, typer.Option("--arrivals", help="synthetic: poisson or bursty")]
DriftOpt = Annotated[float | None, typer.Option("--drift-period", help="synthetic: seconds between drifts")]
NoisyOpt = Annotated[int | None, typer.Option("--noisy-models", help="synthetic: models of a noisy tenant")]
NShareOpt = Annotated[float | None, typer.Option("--noisy-share", help="synthetic: noisy share of requests")]
SeedOpt = Annotated[int | None, typer.Option("--seed", help="synthetic: random seed")]
PolicyOpt = Annotated[list[str] | None, typer.Option("--policy", "-p", help="lru, gdsf, gdsf-decay, offline; repeat")]
CostsOpt = Annotated[Path | None, typer.Option("--costs", help="measured costs, JSON (sim.costs.calibrate)")]
OutOpt = Annotated[Path | None, typer.Option("--out", "-o", help="folder for CSV/JSON/PNG outputs")]


def _overrides(models, requests, tenants, zipf, size_median, size_sigma, rate, arrivals, drift, noisy, nshare,
               seed, trace, policy, costs, sizes_from=None) -> dict:
    return {
        "sizes_from": sizes_from,
        "workload": {"models": models, "requests": requests, "tenants": tenants, "zipf": zipf,
                     "size_median": size_median, "size_sigma": size_sigma, "rate": rate, "arrivals": arrivals,
                     "drift_period_s": drift, "noisy_models": noisy, "noisy_share": nshare, "seed": seed},
        "trace": trace or None,
        "policies": policy or None,
        "costs": json.loads(costs.read_text()) if costs else None,
    }


def _load(config, over):
    from pydantic import ValidationError

    from sim.config import load_config

    try:
        return load_config(config, over)
    except (ValidationError, ValueError, OSError) as e:
        raise typer.BadParameter(str(e)) from None


def _workload(cfg, console: Console):
    """The workload; for a trace, what was replayed and skipped, printed (warnings in bold)."""
    from storage_adapters.base import StorageError

    try:
        wl, rep = cfg.load_workload_report()
    except (ValueError, OSError, StorageError) as e:
        raise typer.BadParameter(str(e)) from None
    if rep is not None:
        for line in rep.summary():
            console.print(f"[bold yellow]{line}[/]" if line.startswith("WARNING") else line, highlight=False)
    return wl


def _warn_shed(console: Console, rows: list[dict], wl, key: str = "shed_rate") -> None:
    from sim.mrc import shed_warnings

    for w in shed_warnings(rows, max((m.size for m in wl.models), default=0), key):
        console.print(f"[bold red]{w}[/]", highlight=False)


def _progress(console: Console) -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=console, transient=True)


def _fmt(v: float, pct: bool = False, nd: int = 1) -> str:
    if isinstance(v, float) and math.isnan(v):
        return "-"
    return f"{v * 100:.1f}%" if pct else f"{v:,.{nd}f}"


def results_table(rows: list[dict], title: str) -> Table:
    """One row per policy (or per policy and tenant when rows carry "tenant"); latency only when measured."""
    per_tenant = any("tenant" in r for r in rows)
    latency = any(not math.isnan(r["p50_ms"]) for r in rows)
    cols = ["policy", *(["tenant"] if per_tenant else []), "requests", "hit rate", "byte miss", "loads",
            "load s", "vs lru", *(["p50 ms", "p99 ms"] if latency else []), "shed"]
    t = Table(title=title)
    for c in cols:
        t.add_column(c, justify="left" if c in ("policy", "tenant") else "right", no_wrap=True)
    lru = {r.get("tenant"): r["load_s"] for r in rows if r["policy"] == "lru"}
    for r in rows:
        base = lru.get(r.get("tenant"))
        cells = [r["policy"], *([r["tenant"]] if per_tenant else []), f"{r['requests']:,}",
                 _fmt(r["hit_rate"], True), _fmt(r["byte_miss_rate"], True), f"{r['loads']:,}", _fmt(r["load_s"], nd=0),
                 f"{r['load_s'] / base:.2f}x" if base else "-",
                 *([_fmt(r["p50_ms"]), _fmt(r["p99_ms"])] if latency else []), _fmt(r["shed_rate"], True)]
        t.add_row(*cells)
    return t


@sim_app.command("run")
def run_cmd(
    config: ConfigOpt = None, trace: TraceOpt = None, models: ModelsOpt = None, requests: RequestsOpt = None,
    tenants: TenantsOpt = None, zipf: ZipfOpt = None, size_median: SizeOpt = None, size_sigma: SigmaOpt = None,
    rate: RateOpt = None, arrivals: ArrOpt = None, drift_period: DriftOpt = None, noisy_models: NoisyOpt = None,
    noisy_share: NShareOpt = None, seed: SeedOpt = None, policy: PolicyOpt = None, costs: CostsOpt = None,
    out: OutOpt = None, sizes_from: SizesFromOpt = None,
    cache_fraction: Annotated[float | None, typer.Option(help="cache size, share of all model bytes")] = None,
    cache_bytes: Annotated[int | None, typer.Option(help="cache size in bytes (per host)")] = None,
    mode: Annotated[str | None, typer.Option(help="cache (fast path) or full (batching, latency)")] = None,
    hosts: Annotated[int | None, typer.Option(help="full mode: number of hosts")] = None,
    per_tenant: Annotated[bool, typer.Option(help="also print a per-tenant table")] = True,
) -> None:
    """Run each policy on one workload and compare them."""
    from sim.cluster import run_cluster
    from sim.mrc import run_policy
    from sim.offline import run_offline

    over = _overrides(models, requests, tenants, zipf, size_median, size_sigma, rate, arrivals, drift_period,
                      noisy_models, noisy_share, seed, trace, policy, costs, sizes_from)
    over.update(cache_fraction=cache_fraction, cache_bytes=cache_bytes, mode=mode, hosts=hosts)
    cfg = _load(config, over)
    console = Console()
    wl = _workload(cfg, console)
    size, cm = cfg.cache_size(wl), cfg.cost_model()
    results = []
    with _progress(console) as prog:
        for p in cfg.policies:
            task = prog.add_task(p, total=len(wl))
            if cfg.mode == "full" and p == "offline":
                r = run_offline(wl, size, cm, host_ram_bytes=cfg.host_ram_bytes)
            elif cfg.mode == "full":
                r = run_cluster(wl, cfg.cluster(p, size), cm, placement=cfg.placement())
            else:
                r = run_policy(wl, size, p, cm, progress=lambda n, t=task: prog.advance(t, n),
                               **cfg.cache_kwargs()) if p != "offline" else run_policy(wl, size, p, cm, **cfg.cache_kwargs())
            prog.update(task, completed=len(wl))
            results.append(r)
    src = f"trace {', '.join(map(str, cfg.trace))}" if cfg.trace else f"{len(wl.models)} models, zipf {cfg.workload.zipf}"
    title = f"{len(wl):,} requests, {src}, cache {size / 1e9:.2f} GB ({size / wl.total_bytes:.0%}), {cfg.mode} mode"
    rows = [r.row() for r in results]
    console.print(results_table(rows, title))
    trows = [tr for r in results for tr in r.tenant_rows()]
    if per_tenant and len(wl.tenants) > 1:
        console.print(results_table(trows, "per tenant"))
    if any(r.shed_reasons for r in results):
        console.print("shed reasons: " + "; ".join(f"{r.policy}: {r.shed_reasons}" for r in results if r.shed_reasons))
    _warn_shed(console, rows, wl)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps({"config": cfg.model_dump(mode="json"), "results": rows,
                                                      "tenants": trows}, indent=1, default=float))
        console.print(f"wrote {out / 'results.json'}")


@sim_app.command("sweep")
def sweep_cmd(
    config: ConfigOpt = None, trace: TraceOpt = None, models: ModelsOpt = None, requests: RequestsOpt = None,
    tenants: TenantsOpt = None, zipf: ZipfOpt = None, size_median: SizeOpt = None, size_sigma: SigmaOpt = None,
    rate: RateOpt = None, arrivals: ArrOpt = None, drift_period: DriftOpt = None, noisy_models: NoisyOpt = None,
    noisy_share: NShareOpt = None, seed: SeedOpt = None, policy: PolicyOpt = None, costs: CostsOpt = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="folder for mrc.csv and mrc.png")] = Path("sim-out"),
    sizes: Annotated[str | None, typer.Option(help="cache sizes as shares of all bytes, e.g. 0.05,0.1,0.2")] = None,
    sizes_from: SizesFromOpt = None,
    latency: Annotated[bool, typer.Option(help="also run the full engine (batching, queues) at every size and "
                                          "policy: p99 vs cache size in p99.png (slower)")] = False,
) -> None:
    """Hit-rate curves (1 - miss ratio): every policy at every cache size (cache-only fast path) -> table, CSV,
    PNG; shed shown in each."""
    from sim.cluster import run_cluster
    from sim.mrc import human_bytes, plot, plot_latency, sweep, write_csv

    over = _overrides(models, requests, tenants, zipf, size_median, size_sigma, rate, arrivals, drift_period,
                      noisy_models, noisy_share, seed, trace, policy, costs, sizes_from)
    if sizes:
        try:
            over["sizes"] = [float(s) for s in sizes.split(",") if s.strip()]
        except ValueError:
            raise typer.BadParameter(f"--sizes: expected numbers separated by commas, got {sizes!r}") from None
    cfg = _load(config, over)
    console = Console()
    wl = _workload(cfg, console)
    cm = cfg.cost_model()
    lat = (lambda p, size: run_cluster(wl, cfg.cluster(p, size), cm, placement=cfg.placement())) if latency else None
    with _progress(console) as prog:
        task = prog.add_task("sweep", total=len(cfg.policies) * len(cfg.sizes))
        rows = sweep(wl, cfg.sizes, cfg.policies, cm, on_point=lambda _r: prog.advance(task), latency=lat,
                     **cfg.cache_kwargs())
    names = list(dict.fromkeys(r["policy"] for r in rows))
    t = Table(title=f"hit-rate curve, {len(wl):,} requests, {len(wl.models)} models ({human_bytes(wl.total_bytes)})")
    for c in ("cache", "bytes", *names):
        t.add_column(c, justify="right")
    for f in sorted(cfg.sizes):
        cells = []
        for p in names:
            r = next(r for r in rows if r["policy"] == p and r["cache_fraction"] == f)
            cell = f"{r['hit_rate'] * 100:.1f}% / {r['load_s']:,.0f}s / shed {r['shed_rate'] * 100:.0f}%"
            if latency and not math.isnan(r["p99_ms"]):
                cell += f" / p99 {r['p99_ms']:,.0f}ms"
            cells.append(("[red]" if r["shed_rate"] >= 0.5 else "") + cell + (" *" if r["knee"] else ""))
        t.add_row(f"{f * 100:.3g}%", human_bytes(wl.total_bytes * f), *cells)
    console.print(t)
    console.print("cells: hit rate / total load time / share of requests shed" + (" / p99" if latency else "")
                  + "; * marks the knee of the hit-rate curve; red: most requests shed"
                  + ("; offline~ is a heuristic with knowledge of the future, not a bound" if "offline~" in names else ""))
    _warn_shed(console, rows, wl)
    if latency:
        _warn_shed(console, [{**r, "policy": f"{r['policy']} (full engine)"} for r in rows], wl, "latency_shed_rate")
    out.mkdir(parents=True, exist_ok=True)
    csv_path, png_path = write_csv(rows, out / "mrc.csv"), plot(rows, out / "mrc.png", t.title or "")
    console.print(f"wrote {csv_path} and {png_path}")
    if latency:
        title = f"p99 vs cache size (full engine), {len(wl):,} requests, {len(wl.models)} models"
        console.print(f"wrote {plot_latency(rows, out / 'p99.png', title)}")


def register(app: typer.Typer) -> None:
    app.add_typer(sim_app, name="sim")
