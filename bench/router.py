"""The router's cost: the same model and closed-loop load (Triton asyncio clients) sent straight to a hostd
and through a router in front of it, in one run. Prints throughput and p50/p99 for each and the ratios
(target: >= 0.7x the direct throughput, <= +0.3 ms p50). Embedded mode: one hostd, one router with a
tenants file, no Redis. Usage: python bench/router.py [--seconds 4] [--levels 1,32]"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import ROOT, closed_loop, free_port, start_hostd, stop, wait_serving  # noqa: E402
from mmhost.demo_models import build_onnx_mlp, onnx_manifest  # noqa: E402
from router.tenants import FileTenants  # noqa: E402
from storage_adapters.local import LocalStorage  # noqa: E402
from catalog.publish import publish_version  # noqa: E402
from catalog.repository import ModelRepository  # noqa: E402


def start_router(hostd: str, tenants: Path, store: Path, workdir: Path) -> tuple[subprocess.Popen, str]:
    addr = f"127.0.0.1:{free_port()}"
    log = open(workdir / "router.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mmhost.cli", "router", "--listen", addr, "--hosts", hostd, "--tenants", str(tenants),
         "--store", str(store), "--metrics-port", "0", "--log-level", "WARNING"],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "MMHOST_ROUTER_PLAINTEXT": "true"},
    )
    wait_serving(addr, proc)
    return proc, addr


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--levels", default="1,32")
    ap.add_argument("--dims", default="256,3500,3500,10", help="MLP layer sizes (the reference model by default)")
    a = ap.parse_args()
    levels = [int(c) for c in a.levels.split(",")]
    dims = tuple(int(d) for d in a.dims.split(","))
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        build_onnx_mlp(t / "mlp.onnx", dims)
        repo = ModelRepository(LocalStorage(t / "store"))
        publish_version(repo, onnx_manifest("bench", "mlp", "1", t / "mlp.onnx", "model.onnx"), {"model.onnx": t / "mlp.onnx"})
        key = FileTenants(t / "tenants.json").create("bench")
        print(f"model: ONNX MLP {'-'.join(map(str, dims))}, {(t / 'mlp.onnx').stat().st_size / 1e6:.1f} MB; "
              f"{a.seconds:.0f}s per point; {os.cpu_count()} CPUs")
        hostd, haddr = start_hostd(str(t / "store"), t, "--preload", "--default-tenant", "bench")
        router, raddr = start_router(haddr, t / "tenants.json", t / "store", t)
        headers = {"authorization": f"Bearer {key}"}
        try:
            x = np.random.default_rng(0).random((1, dims[0]), dtype=np.float32)
            rows = []
            for c in levels:
                direct = asyncio.run(closed_loop(haddr, "mlp", "input", x, c, a.seconds))
                routed = asyncio.run(closed_loop(raddr, "mlp", "input", x, c, a.seconds, headers=headers))
                rows.append((c, direct, routed))
        finally:
            stop(router)
            stop(hostd)
    print(f"{'conc':>5} | {'direct req/s':>12} {'p50 ms':>7} {'p99 ms':>7} | {'router req/s':>12} {'p50 ms':>7} "
          f"{'p99 ms':>7} | {'thru ratio':>10} {'p50 +ms':>8} {'p99 ratio':>9}")
    for c, d, r in rows:
        ratio = r["rps"] / d["rps"] if d["rps"] else float("nan")
        errs = f"  errors direct={d['errors']} router={r['errors']}" if d["errors"] or r["errors"] else ""
        print(f"{c:>5} | {d['rps']:12.0f} {d['p50']:7.2f} {d['p99']:7.2f} | {r['rps']:12.0f} {r['p50']:7.2f} "
              f"{r['p99']:7.2f} | {ratio:9.2f}x {r['p50'] - d['p50']:+8.2f} {r['p99'] / d['p99']:8.2f}x{errs}")


if __name__ == "__main__":
    main()
