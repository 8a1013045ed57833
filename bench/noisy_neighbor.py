"""Noisy neighbour: a light tenant's latency alone, then beside a tenant sending 10x its quota to a slow model,
in one run, through a real router and hostd (embedded mode, one tenants file configuring both).

    .venv/bin/python -m bench.noisy_neighbor [--seconds 5] [--quota 20]

Prints the light tenant's p50/p99 in both phases, their ratio, and both tenants' answers and shed counts
(as the clients saw them and as the router's mmhost_requests_shed_total counted them)."""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from bench._common import ROOT, free_port, start_hostd, stop, wait_serving
from bench._tenants import Outcomes, open_loop, steady
from protos import grpc_service_pb2_grpc
from router.tenants import FileTenants
from tests.hostd_proc import metric_value
from tests.isolation.conftest import build_store, fast_request, slow_request


def start_router(work: Path, host: str, tenants: Path, store: Path) -> tuple[subprocess.Popen, str, int]:
    port, mport = free_port(), free_port()
    addr = f"127.0.0.1:{port}"
    log = open(work / f"router-{port}.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mmhost.cli", "router", "--listen", addr, "--hosts", host, "--tenants", str(tenants),
         "--store", str(store), "--metrics-port", str(mport), "--refresh-interval", "0.2", "--log-level", "WARNING"],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "MMHOST_ROUTER_PLAINTEXT": "true"},
    )
    wait_serving(addr, proc)
    return proc, addr, mport


async def _light(addr: str, key: str, seconds: float) -> Outcomes:
    async with grpc.aio.insecure_channel(addr) as ch:
        stub = grpc_service_pb2_grpc.GRPCInferenceServiceStub(ch)
        return await steady(stub, fast_request(), (("authorization", f"Bearer {key}"),), seconds, interval_s=0.01)


def _noisy(addr: str, key: str, rate: float, seconds: float, out: list) -> threading.Thread:
    async def go() -> Outcomes:
        async with grpc.aio.insecure_channel(addr) as ch:
            stub = grpc_service_pb2_grpc.GRPCInferenceServiceStub(ch)
            return await open_loop(stub, slow_request(), (("authorization", f"Bearer {key}"),), rate, seconds)

    t = threading.Thread(target=lambda: out.append(asyncio.run(go())), daemon=True)
    t.start()
    return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0, help="length of each phase")
    ap.add_argument("--quota", type=float, default=20.0, help="the noisy tenant's rate quota (requests/s)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        store = work / "store"
        build_store(store, work)
        tenants = work / "tenants.json"
        reg = FileTenants(tenants)
        keys = {"noisy": reg.create("noisy", "free", {"rate": args.quota, "burst": int(args.quota // 4) or 1,
                                                      "max_concurrency": 8}),
                "light": reg.create("light", "standard")}
        hostd, host = start_hostd(str(store), work, "--tenant-limits", str(tenants), "--ort-threads", "1")
        router, addr, mport = start_router(work, host, tenants, store)
        try:
            r = grpc_service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(addr))
            r.ModelInfer(slow_request(), metadata=(("authorization", f"Bearer {keys['noisy']}"),), timeout=60)
            r.ModelInfer(fast_request(), metadata=(("authorization", f"Bearer {keys['light']}"),), timeout=60)
            asyncio.run(_light(addr, keys["light"], 0.5))  # warm-up
            solo = asyncio.run(_light(addr, keys["light"], args.seconds))
            box: list[Outcomes] = []
            t = _noisy(addr, keys["noisy"], 10 * args.quota, args.seconds + 0.5, box)
            time.sleep(0.25)
            beside = asyncio.run(_light(addr, keys["light"], args.seconds))
            t.join(120)
            noisy = box[0]
            text = urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=5).read().decode()
        finally:
            stop(router)
            stop(hostd)

    def shed(tenant: str) -> int:
        return int(metric_value(text, "mmhost_requests_shed_total", tenant=tenant))

    print(f"noisy neighbour: light tenant alone vs beside a tenant at 10x its quota ({10 * args.quota:g} requests/s "
          f"offered, quota {args.quota:g}/s) on a slow model, {args.seconds:g} s each, one router + one hostd")
    print(f"{'phase':<10}{'requests':>10}{'p50 ms':>10}{'p99 ms':>10}{'refused':>10}")
    for name, o in (("alone", solo), ("beside", beside)):
        print(f"{name:<10}{len(o.latencies):>10}{o.pct(50):>10.2f}{o.pct(99):>10.2f}{o.refused:>10}")
    print(f"ratio beside/alone: p50 {beside.pct(50) / solo.pct(50):.2f}x, p99 {beside.pct(99) / solo.pct(99):.2f}x")
    print(f"noisy tenant: sent {sum(noisy.codes.values())}, served {noisy.codes['OK']}, "
          f"refused {noisy.refused} ({dict(noisy.reasons)}), retry-after-ms on "
          f"{sum(1 for x in noisy.retry_after_ms if x)}/{len(noisy.retry_after_ms)}")
    print(f"router shed counter: noisy {shed('noisy')}, light {shed('light')}")


if __name__ == "__main__":
    main()
