"""Dynamic batching on vs off for the same ~50 MB ONNX MLP (256-3500-3500-10), closed-loop Triton asyncio
clients at concurrency 1, 8, 32, 64. Prints throughput and p50/p99 for each and the on/off ratio, all
measured in this one run. Usage: python bench/batching.py [--seconds 4]"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import closed_loop, start_hostd, stop  # noqa: E402
from mmhost.demo_models import build_onnx_mlp, onnx_manifest  # noqa: E402
from storage_adapters.local import LocalStorage  # noqa: E402
from catalog.publish import publish_version  # noqa: E402
from catalog.repository import ModelRepository  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--levels", default="1,8,32,64")
    a = ap.parse_args()
    levels = [int(c) for c in a.levels.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        build_onnx_mlp(t / "mlp.onnx", (256, 3500, 3500, 10))
        repo = ModelRepository(LocalStorage(t / "store"))
        publish_version(repo, onnx_manifest("demo", "mlp_on", "1", t / "mlp.onnx", "model.onnx"), {"model.onnx": t / "mlp.onnx"})
        off = onnx_manifest("demo", "mlp_off", "1", t / "mlp.onnx", "model.onnx").model_copy(update={"max_batch_size": 0})
        publish_version(repo, off, {"model.onnx": t / "mlp.onnx"})
        print(f"model: ONNX MLP 256-3500-3500-10, {(t / 'mlp.onnx').stat().st_size / 1e6:.1f} MB; {a.seconds:.0f}s per point")
        proc, addr = start_hostd(str(t / "store"), t, "--preload")
        try:
            x = np.random.default_rng(0).random((1, 256), dtype=np.float32)
            rows = []
            for c in levels:
                on = asyncio.run(closed_loop(addr, "mlp_on", "input", x, c, a.seconds))
                off_r = asyncio.run(closed_loop(addr, "mlp_off", "input", x, c, a.seconds))
                rows.append((c, on, off_r))
        finally:
            stop(proc)
    print(f"{'conc':>5} | {'on req/s':>9} {'p50 ms':>7} {'p99 ms':>7} | {'off req/s':>9} {'p50 ms':>7} {'p99 ms':>7} | on/off")
    for c, on, off_r in rows:
        ratio = on["rps"] / off_r["rps"] if off_r["rps"] else float("nan")
        errors = f"  errors on={on['errors']} off={off_r['errors']}" if on["errors"] or off_r["errors"] else ""
        print(f"{c:>5} | {on['rps']:9.0f} {on['p50']:7.2f} {on['p99']:7.2f} | {off_r['rps']:9.0f} {off_r['p50']:7.2f} "
              f"{off_r['p99']:7.2f} | {ratio:5.2f}x" + errors)


if __name__ == "__main__":
    main()
