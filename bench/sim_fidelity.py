"""The simulator checked against the real system on the same traces. Targets: hit rate within 3 points,
p99 within 25%, shed rate within 2 points, on two traces: a Zipf trace (Poisson arrivals) and a bursty trace
with a noisy tenant (bursts of 3x the base rate; a tenant whose requests spread evenly over its own 30 models).

Per trace:
1. The synthetic workload (sim/workload.py, fixed seed, lognormal sizes) is made real: one ONNX MLP per model,
   its hidden width chosen so the file has the model's size (a few MB), published to a local store. Each hostd
   gets a device budget that forces evictions (a share of all model bytes).
2. Real run: one router (embedded mode, access log on) and two hostds on CPU. The trace's arrival times are
   replayed OPEN-LOOP (each request sent at its time, not waiting for earlier answers). The hostds' /metrics
   are scraped every 0.5 s, the router's at the start and end.
3. Calibration: sim/calibrate.py, what `mmhost sim calibrate --from-metrics` runs, on those scrapes (load
   stages, compute per batch, overhead outside hostd, budgets, slots, load workers); sizes = hostd's measured
   memory per model.
4. Sim run: the router's access log read back as the trace, two simulated hosts with the calibrated config:
   hostd's load path (4 load workers, one deserialize at a time under the loader's lock, evictions closing
   through the pool), its execution slots, the router's placement policy and its retries on no_capacity.
   Each load's locked stage and measured size are drawn from the spreads hostd's metrics show, so the sim
   runs once per seed (--sim-seeds): the median is compared, the p99's range over seeds is printed.

5. With --real-runs R (R > 1), steps 2-4 run R times per trace: each real run is calibrated and simulated on
   its own, and the targets are judged on the median of the R real runs against the median of their R sims
   (sim/fidelity_targets.py says why); every run's figures, the spread of p99 over the runs and in how many
   runs each target held against its own run are printed too.

Prints both traces side by side (real, sim, target, held) and where a load's time goes on each side
(hostd's mmhost_model_load_path_seconds vs the sim's load waits).

Usage: python bench/sim_fidelity.py [--requests 2400] [--rate 40] [--models 30] [--only zipf|bursty]
       [--real-runs 3]   (about 1.5 min per trace and real run on 2 CPUs)"""

from __future__ import annotations

import argparse
from dataclasses import replace
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import PLAINTEXT_DEV, ROOT, free_port, stop, wait_serving  # noqa: E402
from mmhost.demo_models import build_onnx_mlp, onnx_manifest  # noqa: E402
from router.placement_policy import PlacementConfig  # noqa: E402
from router.tenants import FileTenants  # noqa: E402
from sim.calibrate import calibrate_cluster, delta, parse_router_metrics, pooled, spread_from_buckets  # noqa: E402
from sim.cluster import Cluster  # noqa: E402
from sim.config import SimConfig  # noqa: E402
from sim.costs import spread_points  # noqa: E402
from sim.fidelity import HostdScrape, measured_sizes, parse_hostd_metrics  # noqa: E402
from sim.fidelity_targets import held_in, judge, median, run_spread  # noqa: E402
from sim.placement import RouterPlacement  # noqa: E402
from sim.trace import access_records, read_trace  # noqa: E402
from sim.workload import SyntheticConfig, Workload, generate  # noqa: E402
from storage_adapters.local import LocalStorage  # noqa: E402
from catalog.publish import publish_version  # noqa: E402
from catalog.repository import ModelRepository  # noqa: E402

IN_DIM, OUT_DIM = 256, 10
STAGES = ("evict", "pool_wait", "lock_wait", "locked", "total")  # hostd's load-path stages


def hidden_for(size: int) -> int:
    """Hidden width h of a 256-h-h-10 float32 MLP whose weights take about `size` bytes."""
    params = size / 4
    return max(16, int((-(IN_DIM + 2 + OUT_DIM) + np.sqrt((IN_DIM + 2 + OUT_DIM) ** 2 + 4 * params)) / 2))


def scrape(port: int) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()


def spawn(args: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "mmhost.cli", *args], cwd=ROOT, stdout=open(log, "wb"),
                            stderr=subprocess.STDOUT, env={**os.environ, "MMHOST_HOSTD_TORCH_THREADS": "1", **PLAINTEXT_DEV})


class Scraper(threading.Thread):
    """Scrapes each hostd's metrics every `every` seconds until stopped; keeps every parsed scrape."""

    def __init__(self, ports: list[int], every: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.ports, self.every = ports, every
        self.scrapes: list[list[HostdScrape]] = [[] for _ in ports]
        self._done = threading.Event()

    def once(self) -> None:
        for i, p in enumerate(self.ports):
            s = parse_hostd_metrics(scrape(p))
            s.at = time.monotonic()
            self.scrapes[i].append(s)

    def run(self) -> None:
        while not self._done.wait(self.every):
            self.once()

    def finish(self) -> None:
        self._done.set()
        self.join()
        self.once()


async def replay(addr: str, wl, keys: dict[str, str], x: np.ndarray, speed: float = 1.0) -> int:
    """Open loop: request i is sent at its trace time (relative to the first), whatever is still in flight.
    Returns the client's errors (the latencies compared are the router's, from its access log)."""
    import grpc

    from protos import grpc_service_pb2 as pb
    from protos import grpc_service_pb2_grpc as pbg

    ch = grpc.aio.insecure_channel(addr)
    stub = pbg.GRPCInferenceServiceStub(ch)
    raw = x.tobytes()
    errors = 0

    async def one(key: str) -> None:
        nonlocal errors
        tenant, model, version = key.split("/")
        req = pb.ModelInferRequest(model_name=model, model_version=version, raw_input_contents=[raw],
                                   inputs=[pb.ModelInferRequest.InferInputTensor(name="input", datatype="FP32",
                                                                                  shape=list(x.shape))])
        try:
            await stub.ModelInfer(req, metadata=(("authorization", f"Bearer {keys[tenant]}"),), timeout=60)
        except grpc.aio.AioRpcError as e:
            errors += 1
            if errors <= 3:
                print(f"  error: {key}: {e.code().name} {e.details()}", file=sys.stderr)

    start = time.perf_counter()
    t_first = float(wl.ts[0])
    tasks = []
    for t, m in zip(wl.ts.tolist(), wl.model.tolist(), strict=True):
        delay = start + (t - t_first) / speed - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(wl.models[m].key)))
    await asyncio.gather(*tasks)
    await ch.close()
    return errors


async def warmup(addr: str, key: str, api_key: str, x: np.ndarray, n: int) -> None:
    """`n` requests, one at a time, to a model of a tenant of its own, before the trace: the processes' first
    calls (connections, code paths, that model's load) stay out of the figures (the scrapes start after it,
    its access-log lines are dropped)."""
    import grpc

    from protos import grpc_service_pb2 as pb
    from protos import grpc_service_pb2_grpc as pbg

    _, model, version = key.split("/")
    async with grpc.aio.insecure_channel(addr) as ch:
        stub = pbg.GRPCInferenceServiceStub(ch)
        req = pb.ModelInferRequest(model_name=model, model_version=version, raw_input_contents=[x.tobytes()],
                                   inputs=[pb.ModelInferRequest.InferInputTensor(name="input", datatype="FP32",
                                                                                  shape=list(x.shape))])
        for _ in range(n):
            await stub.ModelInfer(req, metadata=(("authorization", f"Bearer {api_key}"),), timeout=60)


def pct(v: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(v) * 1e3, q)) if v else float("nan")


def real_run(wl: Workload, a: argparse.Namespace, t: Path, keep: Path | None) -> dict:
    """The trace through router + 2 hostds; returns what the comparison needs (and copies the access log,
    sizes and sim config to `keep`)."""
    repo = ModelRepository(LocalStorage(t / "store"))
    file_bytes: dict[str, int] = {}
    for i, spec in enumerate(wl.models):
        tenant, model, version = spec.key.split("/")
        f = t / "build" / f"{model}.onnx"
        build_onnx_mlp(f, (IN_DIM, hidden_for(spec.size), hidden_for(spec.size), OUT_DIM), seed=i)
        publish_version(repo, onnx_manifest(tenant, model, version, f, "model.onnx"), {"model.onnx": f})
        file_bytes[spec.key] = f.stat().st_size
    f = t / "build" / "warm.onnx"  # the warm-up model, its own tenant: not in the trace
    build_onnx_mlp(f, (IN_DIM, 64, OUT_DIM))
    publish_version(repo, onnx_manifest("warm", "w", "1", f, "model.onnx"), {"model.onnx": f})
    tenants = FileTenants(t / "tenants.json")
    keys = {name: tenants.create(name) for name in [*wl.tenants, "warm"]}
    total = sum(file_bytes.values())
    budget = int(total * a.cache_fraction)
    hostds, addrs, mports = [], [], []
    for _ in range(2):
        port, mport = free_port(), free_port()
        addr = f"127.0.0.1:{port}"
        hostds.append(spawn(["hostd", "--listen", addr, "--store", str(t / "store"), "--metrics-port", str(mport),
                             "--cache-dir", str(t / f"cache-{port}"), "--ort-threads", "1", "--lazy",
                             "--device-memory", str(budget), "--default-tenant", "warm", "--log-level", "WARNING"],
                            t / f"hostd-{port}.log"))
        addrs.append(addr)
        mports.append(mport)
    rport, rmport = free_port(), free_port()
    raddr = f"127.0.0.1:{rport}"
    access = t / "access.jsonl"
    router = spawn(["router", "--listen", raddr, "--hosts", ",".join(addrs), "--tenants", str(t / "tenants.json"),
                    "--store", str(t / "store"), "--metrics-port", str(rmport), "--access-log", str(access),
                    "--log-level", "WARNING"], t / "router.log")
    x = np.random.default_rng(0).random((1, IN_DIM), dtype=np.float32)
    try:
        for p, addr in zip(hostds, addrs, strict=True):
            wait_serving(addr, p)
        wait_serving(raddr, router)
        time.sleep(1.0)  # the router's first view of both hosts (refresh every 0.5 s)
        asyncio.run(warmup(raddr, "warm/w/1", keys["warm"], x, 20))
        scraper = Scraper(mports)
        scraper.once()
        r0 = parse_router_metrics(scrape(rmport))
        scraper.start()
        t_run = time.perf_counter()
        errors = asyncio.run(replay(raddr, wl, keys, x))
        run_s = time.perf_counter() - t_run
        scraper.finish()
        r1 = parse_router_metrics(scrape(rmport))
    finally:
        stop(router)
        for p in hostds:
            stop(p)
    series = scraper.scrapes
    sizes = {k: v for k, v in measured_sizes(s for host in series for s in host).items() if k in file_bytes}
    ratio = float(np.median([sizes[k] / file_bytes[k] for k in file_bytes if sizes.get(k)] or [1.0]))
    for k in file_bytes:
        sizes.setdefault(k, int(file_bytes[k] * ratio))
    loads = sum(sum(h[-1].loads.values()) - sum(h[0].loads.values()) for h in series)
    path = {st: sum(delta(h, "path", st) for h in series) / max(loads, 1) for st in STAGES}
    recs = [r for r in access_records(access) if r["tenant"] != "warm"]
    spread = spread_points(spread_from_buckets(pooled(series, "total_buckets")))  # load totals / their mean
    path["total p90"], path["total p99"] = (float(np.interp(q, *spread)) * path["total"] for q in (0.9, 0.99))
    evictions = {k: sum(delta(h, a) for h in series)
                 for k, a in (("capacity", "evictions"), ("watermark", "watermark_evictions"))}
    # the time outside hostd per request from the router's access log (what `sim calibrate --access-log` reads)
    cfg = calibrate_cluster(series, [[r0, r1]], sizes, access_log=recs)
    if keep:
        keep.mkdir(parents=True, exist_ok=True)
        (keep / "access.jsonl").write_text(access.read_text())
        (keep / "sizes.json").write_text(json.dumps(sizes))
        (keep / "sim-config.json").write_text(json.dumps(cfg, indent=1))
    return {"recs": recs, "sizes": sizes, "cfg": cfg, "loads": loads, "path": path, "run_s": run_s,
            "errors": errors, "total": total, "evictions": evictions, "budget": budget, "file_bytes": file_bytes}


def sim_once(real: dict, twl: Workload, seed: int) -> tuple[dict, Cluster, RouterPlacement]:
    cfg = SimConfig.model_validate(real["cfg"])
    hook = RouterPlacement(PlacementConfig(), seed=seed)
    cl = replace(cfg.cluster("lru", cfg.cache_bytes or real["budget"]), seed=seed)
    cluster = Cluster(twl, cl, cfg.cost_model(), placement=hook)
    res = cluster.run().total
    return {"hit": 1 - res.loads / max(res.requests, 1), "p50": pct(res.latencies, 50), "p99": pct(res.latencies, 99),
            "shed": res.shed / max(res.requests, 1), "loads": res.loads,
            "path": {**{k: float(np.mean(v)) if v else float("nan") for k, v in cluster.load_waits.items()},
                     "total p90": pct(cluster.load_waits["total"], 90) / 1e3,
                     "total p99": pct(cluster.load_waits["total"], 99) / 1e3}}, cluster, hook


def sim_run(real: dict, seeds: int, t: Path) -> tuple[dict, Cluster, RouterPlacement]:
    """The router's access log replayed through the sim, configured as `mmhost sim calibrate` would, once per
    seed (the draws of load times and sizes, the placement's): the median of each figure, and the p99's range."""
    trace = t / "trace.jsonl"
    trace.write_text("".join(json.dumps({k: r[k] for k in ("ts", "tenant", "model", "version")}) + "\n"
                             for r in real["recs"]))
    twl = read_trace(trace, sizes=real["sizes"])
    first, cluster, hook = sim_once(real, twl, 0)  # seed 0's cluster and hook: printed by compare
    runs = [first] + [sim_once(real, twl, s)[0] for s in range(1, seeds)]
    out = {k: float(np.median([r[k] for r in runs])) for k in ("hit", "p50", "p99", "shed", "loads")}
    out["path"] = {k: float(np.median([r["path"][k] for r in runs])) for k in runs[0]["path"]}
    out["p99 range"] = (min(r["p99"] for r in runs), max(r["p99"] for r in runs))
    return out, cluster, hook


FIGURES = ("hit", "p50", "p99", "shed", "loads")


def one_run(name: str, wl: Workload, a: argparse.Namespace, i: int) -> dict:
    """Real run `i` of the trace, and the sim calibrated from it replaying its access log."""
    tag = name if a.real_runs == 1 else f"{name} run {i + 1}/{a.real_runs}"
    keep = None if not a.keep else a.keep / name if a.real_runs == 1 else a.keep / name / f"run{i + 1}"
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        real = real_run(wl, a, t, keep)
        load_avg = os.getloadavg()[0]  # over the last minute: the real run's own, mostly
        sim, cluster, hook = sim_run(real, a.sim_seeds, t)
    recs = real["recs"]
    n = len(recs)
    ok = [r["total_ms"] for r in recs if r["status"] == "OK"]
    out = {"n": n, "load avg": load_avg,
           "real": {"hit": 1 - real["loads"] / max(n, 1), "p50": float(np.percentile(ok, 50)),
                    "p99": float(np.percentile(ok, 99)), "shed": (n - len(ok)) / max(n, 1),
                    "loads": real["loads"], "path": real["path"]}, "sim": sim}
    c = real["cfg"]["costs"]
    fb = real["file_bytes"]
    ov = {k: np.interp([0.5, 0.99], *spread_points(c[key])) * 1e3 for k, key in
          (("ready", "request_overhead_spread"), ("waited", "request_overhead_spread_loaded")) if c.get(key)}
    print(f"[{tag}] {n} requests over {len(wl.models)} models ({real['total'] / 1e6:.0f} MB of ONNX files, "
          f"{min(fb.values()) / 1e6:.1f}-{max(fb.values()) / 1e6:.1f} MB each), replayed open-loop in "
          f"{real['run_s']:.0f}s (load average {load_avg:.1f}); device budget {real['budget'] / 1e6:.1f} MB per "
          f"hostd ({a.cache_fraction:.0%} of all files); client errors {real['errors']}; evictions real "
          f"{real['evictions']}, sim (seed 0) {cluster.evictions}; sim placements {hook.decisions}, sim shed "
          f"{cluster.shed_reasons}")
    print(f"[{tag}] calibrated: locked stage {c.get('load_fixed_s', 0) * 1e3:.1f} ms + "
          f"{c.get('locked_s_per_byte', 0) * 1e9:.1f} ms/MB, first stage (storage) "
          f"{c.get('load_s_per_byte', {}).get('storage', 0) * 1e9:.1f} ms/MB, overhead outside hostd "
          f"{c['request_overhead_s'] * 1e3:.1f} ms (p50/p99 from the access log: "
          + ", ".join(f"{k} {v[0]:.1f}/{v[1]:.1f}" for k, v in ov.items())
          + "".join(f"; waited {'<= ' + format(b * 1e3, '.0f') + ' ms' if b is not None else 'longer'} "
                    f"{'/'.join(format(x, '.1f') for x in np.interp([0.5, 0.99], *spread_points(sp)) * 1e3)}"
                    for b, sp in c.get("request_overhead_by_wait", [])) + f"), close {c.get('unload_s', 0) * 1e3:.1f} ms, "
          f"locked-stage spread p50/p90/p99 x{np.interp([0.5, 0.9, 0.99], *spread_points(c.get('locked_spread', [[1, 0], [1, 1]])))}, "
          f"streaks {c.get('locked_corr', 0):.2f} over {c.get('locked_window_s', 0):.1f}s, slots {real['cfg'].get('slots')}, "
          f"load workers {real['cfg']['load_workers']}")
    return out


def compare(name: str, wl: Workload, a: argparse.Namespace) -> dict:
    """The trace's real runs and their sims; each side's figure is its median over the real runs (with one run:
    that run's)."""
    runs = [one_run(name, wl, a, i) for i in range(a.real_runs)]

    real = median([r["real"] for r in runs], FIGURES) | {"path": median([r["real"]["path"] for r in runs],
                                                                        list(runs[0]["real"]["path"]))}
    sim = median([r["sim"] for r in runs], FIGURES) | {"path": median([r["sim"]["path"] for r in runs],
                                                                     list(runs[0]["sim"]["path"]))}
    sim["p99 range"] = (min(r["sim"]["p99 range"][0] for r in runs), max(r["sim"]["p99 range"][1] for r in runs))
    return {"name": name, "n": runs[0]["n"], "runs": runs, "real": real, "sim": sim}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=2400)
    ap.add_argument("--models", type=int, default=30)
    ap.add_argument("--rate", type=float, default=40.0, help="Zipf trace: mean arrivals per second (Poisson)")
    ap.add_argument("--zipf", type=float, default=0.9)
    ap.add_argument("--cache-fraction", type=float, default=0.4, help="each hostd's budget, share of all bytes")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--only", choices=["zipf", "bursty"], help="run one trace")
    ap.add_argument("--sim-seeds", type=int, default=9, help="sim runs per trace (median reported)")
    ap.add_argument("--keep", type=Path, help="copy each trace's access log, sizes and sim config here")
    ap.add_argument("--real-runs", type=int, default=1,
                    help="real runs per trace, each calibrated and simulated on its own: the targets are judged on "
                         "the median over the runs on both sides (the real p99 moves run to run on a shared box)")
    a = ap.parse_args()
    t_bench = time.perf_counter()
    common = dict(models=a.models, requests=a.requests, tenants=2, size_median=2.5e6, size_sigma=0.6,
                  size_min=600_000, size_max=8_000_000, zipf=a.zipf, seed=a.seed)
    traces = {
        "zipf": SyntheticConfig(**common, rate=a.rate),
        # bursts of 3x the base rate for 5 s, one period in 4; a noisy tenant: 25% of requests, uniform over
        # its own 30 models (the scan that floods the load path)
        "bursty": SyntheticConfig(**common, rate=a.rate * 0.6, arrivals="bursty", burst_factor=3.0, burst_prob=0.25,
                                  burst_period_s=5.0, noisy_models=a.models, noisy_share=0.25),
    }
    results = [compare(name, generate(cfg), a) for name, cfg in traces.items() if a.only in (None, name)]
    print()
    side = "real" if a.real_runs == 1 else f"real med{a.real_runs}"
    w = 12 if a.real_runs == 1 else 18  # the real column's width
    head = f"{'':16}" + "".join(f"{r['name'] + ' ' + side:>{w}}{'sim':>9}" for r in results) + f"{'target':>12}"
    print(head)
    rows = [("hit rate %", "hit", 100, "<= 3 points"), ("p50 ms", "p50", 1, ""), ("p99 ms", "p99", 1, "<= 25%"),
            ("shed rate %", "shed", 100, "<= 2 points"), ("loads", "loads", 1, "")]
    for label, k, mul, target in rows:
        print(f"{label:16}" + "".join(f"{r['real'][k] * mul:{w}.1f}{r['sim'][k] * mul:9.1f}" for r in results)
              + f"{target:>12}")
    print(f"{'sim p99 range':16}" + "".join(f"{'':{w}}{r['sim']['p99 range'][0]:4.0f}-{r['sim']['p99 range'][1]:<4.0f}"
                                            for r in results) + f"{'(seeds)' if a.real_runs == 1 else '(all runs)':>12}")
    for st in (*STAGES, "total p90", "total p99"):
        cells = "".join(f"{r['real']['path'][st] * 1e3:{w}.1f}{r['sim']['path'].get(st, float('nan')) * 1e3:9.1f}"
                        for r in results)
        print(f"{'load ' + st + ' ms':16}{cells}{'' if ' ' in st else '(mean)':>12}")
    if a.real_runs > 1:  # every run's own figures: real (that run) and sim (calibrated from it, median of seeds)
        for i in range(a.real_runs):
            for label, k, mul in (("hit %", "hit", 100), ("p99 ms", "p99", 1), ("shed %", "shed", 100)):
                print(f"{f'run {i + 1} {label}':16}" + "".join(
                    f"{r['runs'][i]['real'][k] * mul:{w}.1f}{r['runs'][i]['sim'][k] * mul:9.1f}" for r in results))
        for key in ("real", "sim"):  # p99's lowest-highest over the runs
            cells = []
            for r in results:
                lo, hi, rel = run_spread([x[key]["p99"] for x in r["runs"]])
                cells.append(f"{f'{lo:.1f}-{hi:.1f} ms (+{rel:.0f}%)':>{w + 9}}")
            print(f"{key + ' p99 spread':16}" + "".join(cells) + f"{'(runs)':>12}")
    print()
    held_all = True
    for r in results:
        verdicts = judge(r["real"], r["sim"])
        per_run = held_in([x["real"] for x in r["runs"]], [x["sim"] for x in r["runs"]])
        parts = []
        for v in verdicts:
            held_all &= v.held
            t = v.target
            runs = "" if a.real_runs == 1 else f", each run's sim vs that run: {per_run[t.key]} of {a.real_runs}"
            parts.append(f"{t.what} off by {v.gap:.1f} {t.unit} (<= {t.limit:g}): {'yes' if v.held else 'NO'}{runs}")
        print(f"{r['name']:>7}: " + "; ".join(parts))
    if a.real_runs > 1:
        print(f"(judged on the median of {a.real_runs} real runs against the median of their {a.real_runs} sims)")
    print("""
reading it: p99 here is a request that waited on one of the slowest loads. On a shared 2-core box the locked
stage (deserialize + warm-up) of a load varies tenfold (the spread the calibration prints); a p99 over ~2400
requests rests on a handful of those loads, so it moves from run to run on both sides: the sim's range over
seeds shows how far. Slow loads also come in streaks (other processes on the box): the sim shares a draw
within a window as often as the per-interval means say (streaks). The mean load stages above are the
like-for-like check of the load path; the real total also holds what no stage times (the thread-to-event-loop
handoff, the GIL under a deserialize), which the sim leaves out.""")
    print(f"all targets held: {'yes' if held_all else 'NO'}; bench took {time.perf_counter() - t_bench:.0f}s on "
          f"{os.cpu_count()} CPUs (load average {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
