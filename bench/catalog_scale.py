"""Routing and catalog cost against the number of registered models, measured in one run.

For N = 10 and N = 10,000 registered (not loaded) models in a local store, one router (embedded mode) in front
of one hostd: every model is looked up once through the router (ModelMetadata: the router's catalog check,
then the hostd's catalog view and manifest), and then one hot model is called in a closed loop. Prints, per N,
the router's and the hostd's resident-memory growth per registered model (target <= 20 KB) and the hot
model's p50 through the router (target: flat from 10 to 10,000).

    .venv/bin/python bench/catalog_scale.py [--large 10000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import psutil  # noqa: E402
from rich.progress import Progress  # noqa: E402

from bench._common import closed_loop, start_hostd, stop  # noqa: E402
from bench.router import start_router  # noqa: E402
from mmhost.demo_models import build_onnx_mlp, onnx_manifest  # noqa: E402
from router.tenants import FileTenants  # noqa: E402
from storage_adapters.local import LocalStorage  # noqa: E402
from catalog.publish import publish_version  # noqa: E402
from catalog.repository import ModelRepository  # noqa: E402


def register(root: Path, n: int, model_file: Path) -> None:
    """n models: the first published properly, the rest as hard links of its file with the same manifest
    (a version is a folder with the file and a manifest, whatever wrote it)."""
    repo = ModelRepository(LocalStorage(root))
    first = publish_version(repo, onnx_manifest("bench", "m0", "1", model_file, "model.onnx"),
                            {"model.onnx": model_file})
    src = root / "tenants/bench/models/m0/1/model.onnx"
    with Progress(transient=True) as bar:
        task = bar.add_task(f"registering {n} models", total=n - 1)
        for i in range(1, n):
            d = root / f"tenants/bench/models/m{i}/1"
            d.mkdir(parents=True)
            os.link(src, d / "model.onnx")
            repo.write_manifest(first.model_copy(update={"model": f"m{i}"}))
            bar.advance(task)


def rss(pid: int) -> int:
    return psutil.Process(pid).memory_info().rss


def measure(n: int, work: Path, model_file: Path, seconds: float) -> dict:
    root = work / f"store{n}"
    register(root, n, model_file)
    tenants = work / f"tenants{n}.json"
    key = FileTenants(tenants).create("bench")
    hostd, haddr = start_hostd(str(root), work, "--default-tenant", "bench")
    router, raddr = start_router(haddr, tenants, root, work)
    import tritonclient.grpc as tc  # Triton's client: our own protos cannot share its process

    headers = {"authorization": f"Bearer {key}"}
    try:
        client = tc.InferenceServerClient(raddr)
        client.get_model_metadata("m0", headers=headers)
        time.sleep(0.5)
        r0, h0 = rss(router.pid), rss(hostd.pid)
        with ThreadPoolExecutor(8) as ex:
            list(ex.map(lambda i: client.get_model_metadata(f"m{i}", headers=headers), range(n)))
        time.sleep(0.5)
        r1, h1 = rss(router.pid), rss(hostd.pid)
        client.close()
        x = np.random.default_rng(0).random((1, 64), dtype=np.float32)
        hot = asyncio.run(closed_loop(raddr, "m0", "input", x, 1, seconds, headers=headers))
    finally:
        stop(router)
        stop(hostd)
    return {"n": n, "router_per_model": (r1 - r0) / n, "hostd_per_model": (h1 - h0) / n, "p50": hot["p50"],
            "rps": hot["rps"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--large", type=int, default=10_000)
    ap.add_argument("--seconds", type=float, default=3.0)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        build_onnx_mlp(work / "m.onnx", (64, 128, 10))
        rows = [measure(n, work, work / "m.onnx", a.seconds) for n in (10, a.large)]
    print("registered | router KB/model | hostd KB/model | hot model via router: req/s  p50 ms")
    for r in rows:
        print(f"{r['n']:>10} | {r['router_per_model'] / 1024:15.1f} | {r['hostd_per_model'] / 1024:14.1f} | "
              f"{r['rps']:20.0f} {r['p50']:7.2f}")
    big = rows[-1]
    worst = max(big["router_per_model"], big["hostd_per_model"]) / 1024
    print(f"per-model memory at {big['n']}: {worst:.1f} KB (target <= 20 KB: {'ok' if worst <= 20 else 'MISSED'}); "
          f"hot p50 {rows[0]['p50']:.2f} -> {big['p50']:.2f} ms ({big['p50'] / rows[0]['p50']:.2f}x, target flat)")


if __name__ == "__main__":
    main()
