"""`mmhost sim calibrate --from-metrics URL [URL...]`: scrape a running cluster's hostds (and routers) and
write a simulator config that `mmhost sim run --config FILE` (with `--trace` for a recorded access log)
accepts. The fitting is sim/calibrate.py's; this module fetches the pages and writes the file."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Annotated

import typer
import yaml
from rich.console import Console

from mmhost.cli_sim import sim_app


def _fetch(url: str, timeout: float) -> str:
    if "://" not in url:
        url = f"http://{url}"
    if not url.rstrip("/").endswith("/metrics"):
        url = url.rstrip("/") + "/metrics"
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - an operator-given metrics URL
        return r.read().decode()


@sim_app.command("calibrate")
def calibrate_cmd(
    from_metrics: Annotated[list[str], typer.Option(
        "--from-metrics", help="a hostd's or a router's Prometheus URL (host:port, /metrics implied); repeat, "
        "or list more URLs after it")],
    more: Annotated[list[str] | None, typer.Argument(help="more metrics URLs", show_default=False)] = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="config to write (.yaml or .json)")] = Path("sim-calibrated.yaml"),
    samples: Annotated[int, typer.Option(min=1, help="scrapes of each URL (2 or more: load samples per interval)")] = 2,
    interval: Annotated[float, typer.Option(min=0.0, help="seconds between scrapes")] = 10.0,
    timeout: Annotated[float, typer.Option(help="seconds per scrape")] = 5.0,
    access_log: Annotated[list[Path] | None, typer.Option(
        "--access-log", help="a router's access log (JSON lines) from the same traffic, repeatable (routers, their "
        "Python-lane workers' FILE.wN): the time requests spend "
        "outside hostd, measured per request: one spread for requests that did not wait on a load and, by how long "
        "they waited, for those that did (default: one spread estimated from the metrics' histograms)")] = None,
) -> None:
    """Measure a running cluster and write a sim config: hosts, device budget, watermarks, RAM tier, slots, load
    workers, load and compute costs, per-request overhead outside hostd."""
    from sim.calibrate import calibrate_cluster, is_router, parse_router_metrics
    from sim.config import SimConfig
    from sim.fidelity import parse_hostd_metrics

    urls = [u for arg in [*from_metrics, *(more or [])] for u in arg.split(",") if u.strip()]
    console = Console()
    pages: dict[str, list[tuple[float, str]]] = {u: [] for u in urls}
    for i in range(samples):
        if i:
            time.sleep(interval)
        for u in urls:
            try:
                pages[u].append((time.monotonic(), _fetch(u, timeout)))
            except OSError as e:
                raise typer.BadParameter(f"{u}: {e}", param_hint="--from-metrics") from None
    hosts, routers = [], []
    for u, got in pages.items():
        if is_router(got[0][1]):
            routers.append([parse_router_metrics(t) for _, t in got])
        elif "mmhost_cache_budget_bytes" in got[0][1]:
            scrapes = [parse_hostd_metrics(t) for _, t in got]
            for (at, _), sc in zip(got, scrapes, strict=True):
                sc.at = at
            hosts.append(scrapes)
        else:
            raise typer.BadParameter(f"{u}: not a hostd's or a router's metrics page", param_hint="--from-metrics")
    if not hosts:
        raise typer.BadParameter("no hostd among the URLs: the costs come from hostd metrics", param_hint="--from-metrics")
    records = []
    if access_log:
        from sim.trace import access_records

        records = [r for f in access_log for r in access_records(f)]
    cfg = calibrate_cluster(hosts, routers, access_log=records)
    SimConfig.model_validate(cfg)  # what sim run will read
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(cfg, indent=1) if out.suffix == ".json" else yaml.safe_dump(cfg, sort_keys=False))
    c = cfg["costs"]
    console.print(f"{len(hosts)} hostd(s), {len(routers)} router(s), {samples} scrape(s) each")
    console.print(f"device budget {cfg.get('cache_bytes', 0) / 1e9:.2f} GB per host, watermarks {cfg.get('high', '-')}/"
                  f"{cfg.get('low', '-')}, slots {cfg.get('slots', '-')}, load workers {cfg['load_workers']}")
    if "load_fixed_s" in c:
        console.print(f"load: {c['load_fixed_s'] * 1e3:.1f} ms + {c['locked_s_per_byte'] * 1e9:.2f} ms/MB under the "
                      f"loader's lock; first stage {c.get('load_s_per_byte', {}).get('storage', 0) * 1e9:.2f} ms/MB "
                      f"from storage")
    else:
        console.print("load: no loads seen (default load costs): scrape while models load, with --samples 2 or more")
    console.print(f"compute: {len(c.get('batches', []))} models; overhead outside hostd "
                  f"{c['request_overhead_s'] * 1e3:.2f} ms per request")
    console.print(f"wrote {out} (mmhost sim run --config {out} --trace ACCESS_LOG)")


def register(app: typer.Typer) -> None:
    """`sim calibrate` joins the `sim` group when this module is imported (mmhost/cli.py imports it)."""
