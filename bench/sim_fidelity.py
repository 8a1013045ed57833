"""The simulator checked against the real system on the same trace (target: hit rate within 3 points, p99
within 25%).

1. A synthetic workload from sim's generator (fixed seed, Zipf popularity, lognormal sizes) is made real: one
   ONNX MLP per model, its hidden width chosen so the file has the model's size (a few MB), published to a
   local store. The hostds get a device budget that forces evictions.
2. Real run: one router (embedded mode, access log on) and two hostds on CPU. The trace's arrival times are
   replayed OPEN-LOOP (each request sent at its time, not waiting for earlier answers), at a rate a 2-core
   machine sustains. Both hostds' /metrics are scraped every 0.5 s.
3. Calibration from the real system's own measurements: load samples from the scrape-to-scrape differences
   (loads, bytes, seconds, tier), compute per batch from the compute-time and batch-size histograms, the
   per-request overhead (router + RPC hops) from a short warm-up before the trace (router forward time minus
   hostd compute time, both from metrics), sizes = hostd's measured memory per model.
4. Sim run: the router's access log read back as the trace (record in production, replay in sim), two
   simulated hosts with the same budget, watermarks, LRU and RAM tier, the router's real placement policy.

Usage: python bench/sim_fidelity.py [--requests 2400] [--rate 40] [--models 30]"""

from __future__ import annotations

import argparse
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
from hostd.batch_policy import BatchConfig  # noqa: E402
from mmhost.demo_models import build_onnx_mlp, onnx_manifest  # noqa: E402
from router.placement_policy import PlacementConfig  # noqa: E402
from router.tenants import FileTenants  # noqa: E402
from sim.cluster import ClusterConfig, run_cluster  # noqa: E402
from sim.costs import calibrate  # noqa: E402
from sim.fidelity import HostdScrape, batch_samples, load_sample, measured_sizes, parse_hostd_metrics  # noqa: E402
from sim.placement import RouterPlacement  # noqa: E402
from sim.trace import read_trace  # noqa: E402
from sim.workload import SyntheticConfig, generate  # noqa: E402
from storage_adapters.local import LocalStorage  # noqa: E402
from catalog.publish import publish_version  # noqa: E402
from catalog.repository import ModelRepository  # noqa: E402

IN_DIM, OUT_DIM = 256, 10
HIGH, LOW = 0.95, 0.85  # hostd's default watermarks


def hidden_for(size: int) -> int:
    """Hidden width h of a 256-h-h-10 float32 MLP whose weights take about `size` bytes."""
    params = size / 4
    return max(16, int((-(IN_DIM + 2 + OUT_DIM) + np.sqrt((IN_DIM + 2 + OUT_DIM) ** 2 + 4 * params)) / 2))


def scrape(port: int) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()


def metric(text: str, name: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


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
            self.scrapes[i].append(parse_hostd_metrics(scrape(p)))

    def run(self) -> None:
        while not self._done.wait(self.every):
            self.once()

    def finish(self) -> None:
        self._done.set()
        self.join()
        self.once()


async def replay(addr: str, wl, keys: dict[str, str], x: np.ndarray, speed: float = 1.0) -> tuple[list[float], int]:
    """Open loop: request i is sent at its trace time (relative to the first), whatever is still in flight."""
    import grpc

    from protos import grpc_service_pb2 as pb
    from protos import grpc_service_pb2_grpc as pbg

    ch = grpc.aio.insecure_channel(addr)
    stub = pbg.GRPCInferenceServiceStub(ch)
    raw = x.tobytes()
    lat: list[float] = []
    errors = 0

    async def one(key: str) -> None:
        nonlocal errors
        tenant, model, version = key.split("/")
        req = pb.ModelInferRequest(model_name=model, model_version=version, raw_input_contents=[raw],
                                   inputs=[pb.ModelInferRequest.InferInputTensor(name="input", datatype="FP32",
                                                                                  shape=list(x.shape))])
        t0 = time.perf_counter()
        try:
            await stub.ModelInfer(req, metadata=(("authorization", f"Bearer {keys[tenant]}"),), timeout=60)
            lat.append(time.perf_counter() - t0)
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
    return lat, errors


async def warmup(addr: str, key: str, api_key: str, x: np.ndarray, n: int) -> None:
    """Concurrency 1 on one model: the per-request overhead outside compute, measured from metrics."""
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=2400)
    ap.add_argument("--models", type=int, default=30)
    ap.add_argument("--rate", type=float, default=40.0, help="mean arrivals per second (Poisson)")
    ap.add_argument("--zipf", type=float, default=0.9)
    ap.add_argument("--cache-fraction", type=float, default=0.4, help="each hostd's budget, share of all bytes")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--keep", type=Path, help="copy the access log and the calibration input here")
    a = ap.parse_args()
    t_bench = time.perf_counter()
    wl = generate(SyntheticConfig(models=a.models, requests=a.requests, tenants=2, size_median=2.5e6, size_sigma=0.6,
                                  size_min=600_000, size_max=8_000_000, zipf=a.zipf, rate=a.rate, seed=a.seed))
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        repo = ModelRepository(LocalStorage(t / "store"))
        file_bytes: dict[str, int] = {}
        for i, spec in enumerate(wl.models):
            tenant, model, version = spec.key.split("/")
            f = t / "build" / f"{model}.onnx"
            build_onnx_mlp(f, (IN_DIM, hidden_for(spec.size), hidden_for(spec.size), OUT_DIM), seed=i)
            publish_version(repo, onnx_manifest(tenant, model, version, f, "model.onnx"), {"model.onnx": f})
            file_bytes[spec.key] = f.stat().st_size
        # the warm-up model, its own tenant: not in the trace
        f = t / "build" / "warm.onnx"
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
            # warm-up: the fixed per-request cost outside the model, from router and hostd metrics
            asyncio.run(warmup(raddr, "warm/w/1", keys["warm"], x, 20))
            r0, h0 = scrape(rmport), [scrape(p) for p in mports]
            asyncio.run(warmup(raddr, "warm/w/1", keys["warm"], x, 200))
            r1, h1 = scrape(rmport), [scrape(p) for p in mports]
            fwd = (metric(r1, "mmhost_router_forward_seconds_sum") - metric(r0, "mmhost_router_forward_seconds_sum")) / \
                  (metric(r1, "mmhost_router_forward_seconds_count") - metric(r0, "mmhost_router_forward_seconds_count"))
            csum = sum(metric(b, "mmhost_compute_duration_seconds_sum") - metric(a_, "mmhost_compute_duration_seconds_sum")
                       for a_, b in zip(h0, h1, strict=True))
            ccount = sum(metric(b, "mmhost_compute_duration_seconds_count") - metric(a_, "mmhost_compute_duration_seconds_count")
                         for a_, b in zip(h0, h1, strict=True))
            overhead = max(0.0, fwd - csum / ccount)

            scraper = Scraper(mports)
            scraper.once()
            base = [s[-1] for s in scraper.scrapes]
            scraper.start()
            t_run = time.perf_counter()
            lat, errors = asyncio.run(replay(raddr, wl, keys, x))
            run_s = time.perf_counter() - t_run
            scraper.finish()
            real_loads = sum(sum(s[-1].loads.values()) - sum(b.loads.values()) for s, b in zip(scraper.scrapes, base, strict=True))
            ram_disk = [s[-1].tiers for s in scraper.scrapes]
        finally:
            stop(router)
            for p in hostds:
                stop(p)
        # -- calibration from what the real run measured --------------------------------------------------
        sizes = {k: v for k, v in measured_sizes(s for host in scraper.scrapes for s in host).items() if k in file_bytes}
        sizes["warm/w/1"] = 0
        ratio = float(np.median([sizes[k] / file_bytes[k] for k in file_bytes if sizes.get(k)] or [1.0]))
        unseen = [k for k in file_bytes if not sizes.get(k)]
        for k in unseen:
            sizes[k] = int(file_bytes[k] * ratio)
        loads = [smp for host in scraper.scrapes for prev, cur in zip(host, host[1:], strict=False)
                 if (smp := load_sample(prev, cur, sizes)) is not None]
        all_scrapes = [host[-1] for host in scraper.scrapes]
        batches = batch_samples(all_scrapes)
        cal = {"loads": loads, "batches": batches, "request_overhead_s": overhead}
        costs = calibrate(cal)
        if a.keep:
            a.keep.mkdir(parents=True, exist_ok=True)
            (a.keep / "calibration.json").write_text(json.dumps(cal, indent=1))
            (a.keep / "access.jsonl").write_text(access.read_text())
            (a.keep / "sizes.json").write_text(json.dumps(sizes))
        # -- the real run, from its access log; the sim, replaying that log -----------------------------------
        recs = [json.loads(line) for line in access.read_text().splitlines() if line.strip()]
        recs = [r for r in recs if r["tenant"] != "warm"]
        ok = [r["total_ms"] for r in recs if r["status"] == "OK"]
        trace = t / "trace.jsonl"
        trace.write_text("".join(json.dumps(r) + "\n" for r in recs))
        twl = read_trace(trace, sizes=sizes)
        hook = RouterPlacement(PlacementConfig(), seed=a.seed)
        cfg = ClusterConfig(hosts=2, device_bytes=budget, policy="lru", high=HIGH, low=LOW,
                            batch=BatchConfig(max_batch_size=32, max_queue_delay=0.0), executors_per_model=1,
                            host_ram_bytes=2 << 30,
                            # hostd's execution slots (its default: one per CPU), on the shared host core
                            slots=max(1, os.cpu_count() or 1))
        sim = run_cluster(twl, cfg, costs, placement=hook).total
    n = len(recs)
    real_hit = 1 - real_loads / max(n, 1)
    sim_hit = 1 - sim.loads / max(sim.requests, 1)  # the same definition on both sides: 1 - loads/requests
    real_p50, real_p99 = float(np.percentile(ok, 50)), float(np.percentile(ok, 99))
    sim_p50, sim_p99 = pct(sim.latencies, 50), pct(sim.latencies, 99)
    tiers = {k: int(sum(t_.get(k, 0) for t_ in ram_disk)) for k in ("host_ram", "disk", "storage")}
    print(f"trace: {n} requests over {len(wl.models)} models ({total / 1e6:.0f} MB of ONNX files, "
          f"{min(file_bytes.values()) / 1e6:.1f}-{max(file_bytes.values()) / 1e6:.1f} MB each), Zipf {a.zipf}, "
          f"Poisson {a.rate:.0f}/s replayed open-loop in {run_s:.0f}s; 2 hostds, device budget "
          f"{budget / 1e6:.1f} MB each ({a.cache_fraction:.0%} of all files), LRU, watermarks {HIGH}/{LOW}; "
          f"{os.cpu_count()} CPUs")
    print(f"calibration: {len(loads)} load samples -> fixed {costs.load_fixed_s * 1e3:.1f} ms + per MB "
          + ", ".join(f"{k} {v * 1e9:.1f} ms" for k, v in costs.load_s_per_byte.items() if any(s['tier'] == k for s in loads))
          + f"; compute per batch (mean over models) {np.mean([b['seconds'] for b in batches]) * 1e3:.2f} ms at "
          f"{np.mean([b['size'] for b in batches]):.2f} rows; request overhead {overhead * 1e3:.2f} ms; measured "
          f"memory / file size {ratio:.2f} (median; {len(unseen)} models never seen resident)")
    print(f"real loads by source: {tiers}; errors {errors}; sim placements {hook.decisions}, "
          f"copies {hook.replications}; sim shed {sim.shed}")
    print()
    print(f"{'':12} {'real':>9} {'sim':>9} {'sim/real':>9}")
    rows = [("hit rate", real_hit * 100, sim_hit * 100, "%"), ("loads", real_loads, sim.loads, ""),
            ("p50 ms", real_p50, sim_p50, ""), ("p99 ms", real_p99, sim_p99, "")]
    for name, r, s_, _unit in rows:
        print(f"{name:12} {r:9.2f} {s_:9.2f} {s_ / r if r else float('nan'):8.2f}x")
    print(f"hit rate gap {abs(sim_hit - real_hit) * 100:.1f} points (target <= 3); p99 off by "
          f"{abs(sim_p99 / real_p99 - 1) * 100:.0f}% (target <= 25%); bench took {time.perf_counter() - t_bench:.0f}s")
    print("""
what explains the differences (see the bench's docstring for the method):
- hit rate is set by the sizes the sim charges against the budget. hostd charges each load's measured memory
  (an RSS delta on CPU, noisy from load to load); the sim gets one size per model (the median reading seen
  in the scrapes). Taking the max reading instead cost about 11 points in one run: the bytes are the lever.
- the sim's view of the hosts is current; the real router's is refreshed every 0.5 s, so some of its
  placements land on a host that just evicted the model (an extra load the sim does not make).
- p99 here is a request that waits on a load. The sim charges the load phases hostd times (fetch, verify,
  read, deserialize, warm-up); the real wait also holds the reservation and eviction (unloads awaited), the
  load thread pool's queue, and 2 CPUs shared by client, router and both hostds, where a deserialize slows
  every request in flight. None of that contention is in the cost model, so the sim's p99 is low.
- p50: the sim adds a per-request overhead measured at concurrency 1 on an idle system; under this load
  the RPC path costs more (CPU contention), so the sim's p50 is low as well.""")


if __name__ == "__main__":
    main()
