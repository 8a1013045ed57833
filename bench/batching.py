"""hostd's dynamic batching against Triton Inference Server's core and a plain per-request server, measured in
one run on the same ~50 MB ONNX MLP (256-3500-3500-10), closed-loop Triton asyncio clients at each concurrency
(default 1 and 32), then the issue's targets and whether each holds:

- hostd throughput at concurrency 32 >= 1.25x Triton's core's, and its p99 no worse;
- hostd p50 at concurrency 1 <= 1.1x the plain per-request server's.

The servers, all started here and all serving the whole run:
- hostd, batching on (max batch 32, no queue delay) and, with --off, the same model with batching off; each
  --variant NAME:KEY=VALUE,... another hostd started with those environment variables (settings), measured in
  the same rounds, so a setting is compared with the default under the same load; --one-slot is the variant
  MMHOST_HOSTD_EXECUTION_SLOTS=1: hostd's CPU plan (hostd/core/sizing.py) gives each of
  min(cores, 4) slots cores // slots intra-op threads, so on 2 cores a lone request runs on one thread where the
  plain server's session uses both (batch 1 of this model: 6.7 ms on one thread, 4.1 ms on two, quiet box);
- Triton's core: nvidia-pytriton's bundled tritonserver, dynamic batcher (max batch 32, no queue delay) in
  front of a Python inference function running the model with onnxruntime (bench/pytriton_server.py; its own
  virtual environment, made on first use: bench/pytriton_env.py). When it cannot be installed or started here
  the bench says why and leaves its column out;
- the plain server: grpc.aio, one request at a time through onnxruntime, no batching (bench/plain_server.py).

Every round measures each concurrency on each server in turn (so load on the shared machine falls on all of
them alike: short windows, several rounds); the figures pool the rounds (throughput: the mean; percentiles: over all
requests). Absolute figures vary with the machine and its load; the ratios are the result.

    python bench/batching.py [--seconds 2] [--levels 1,32] [--rounds 4] [--off] [--one-slot] [--no-triton]
                             [--variant NAME:KEY=VALUE[,KEY=VALUE] ...]"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import pytriton_env  # noqa: E402
from bench._common import ROOT, closed_loop, free_port, start_hostd, start_plain, stop, wait_model_ready  # noqa: E402
from mmhost.demo_models import build_onnx_mlp, onnx_manifest  # noqa: E402
from storage_adapters.local import LocalStorage  # noqa: E402
from catalog.publish import publish_version  # noqa: E402
from catalog.repository import ModelRepository  # noqa: E402

MAX_BATCH = 32
TARGET_C32_THROUGHPUT = 1.25  # hostd / Triton's core, concurrency 32 (and p99 no worse)
TARGET_C1_P50 = 1.1  # hostd / plain per-request server, concurrency 1


def start_group(cmd: list[str], log: Path, env: dict | None = None) -> subprocess.Popen:
    """A server in a process group of its own (pytriton starts tritonserver and stub processes under it)."""
    return subprocess.Popen(cmd, cwd=ROOT, stdout=open(log, "wb"), stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)


def stop_group(proc: subprocess.Popen) -> None:
    """SIGINT to the group (pytriton shuts its Triton down on it), then SIGKILL to what is left."""
    for sig, wait in ((signal.SIGINT, 20), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            os.killpg(proc.pid, signal.SIGKILL)  # its children, if any outlived it
        except (subprocess.TimeoutExpired, ProcessLookupError):
            continue
        return


def start_triton(model_file: Path, work: Path) -> tuple[subprocess.Popen | None, str]:
    """(process, address), or (None, why not)."""
    py, why = pytriton_env.ensure()
    if py is None:
        return None, why
    grpc_port, http_port, metrics_port = free_port(), free_port(), free_port()
    log = work / "pytriton.log"
    proc = start_group([str(py), str(ROOT / "bench" / "pytriton_server.py"), str(model_file), str(grpc_port),
                        str(http_port), str(metrics_port), str(MAX_BATCH), "0"], log, pytriton_env.server_env(py))
    addr = f"127.0.0.1:{grpc_port}"
    try:
        wait_model_ready(addr, "mlp", proc, log, timeout=180)
    except (RuntimeError, TimeoutError) as e:
        stop_group(proc)
        return None, f"pytriton did not start: {e}"
    return proc, addr


def pooled(runs: list[dict], seconds: float) -> dict:
    lat = np.concatenate([r["lat"] for r in runs]) if runs else np.array([])
    arr = lat * 1000 if len(lat) else np.array([float("nan")])
    return {"rps": len(lat) / (seconds * len(runs)), "p50": float(np.percentile(arr, 50)),
            "p99": float(np.percentile(arr, 99)), "errors": sum(r["errors"] for r in runs)}


def per_round(runs: dict[tuple[str, int], list[dict]], a: str, b: str, c: int, key: str) -> str:
    """The median over rounds of a's `key` / b's in the same round, and the range: on a shared machine a burst
    of load in one round moves the pooled figures of the servers measured in it, not the same-round ratios."""
    ratios = sorted(x[key] / y[key] for x, y in zip(runs[a, c], runs[b, c], strict=True))
    return f"per-round median {float(np.median(ratios)):.3f}x ({ratios[0]:.3f}-{ratios[-1]:.3f})"


def verdict(ok: bool) -> str:
    return "HOLDS" if ok else "MISSED"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--levels", default="1,32")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--off", action="store_true", help="also hostd with batching off")
    ap.add_argument("--no-triton", action="store_true", help="leave Triton's core out")
    ap.add_argument("--one-slot", action="store_true",
                    help="also a hostd with one execution slot (so, on CPU, every core's thread for one batch)")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME:KEY=VALUE[,KEY=VALUE]",
                    help="also a hostd started with these environment variables (repeatable), e.g. "
                         "1slot:MMHOST_HOSTD_EXECUTION_SLOTS=1")
    a = ap.parse_args()
    variants: dict[str, dict[str, str]] = {}
    if a.one_slot:
        variants["hostd 1slot"] = {"MMHOST_HOSTD_EXECUTION_SLOTS": "1"}
    for v in a.variant:
        name, _, assigns = v.partition(":")
        variants[name] = dict(kv.split("=", 1) for kv in assigns.split(",") if kv)
    levels = [int(c) for c in a.levels.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        model_file = t / "mlp.onnx"
        build_onnx_mlp(model_file, (256, 3500, 3500, 10))
        repo = ModelRepository(LocalStorage(t / "store"))
        on = onnx_manifest("demo", "mlp_on", "1", model_file, "model.onnx").model_copy(update={"max_batch_size": MAX_BATCH})
        publish_version(repo, on, {"model.onnx": model_file})
        off = onnx_manifest("demo", "mlp_off", "1", model_file, "model.onnx").model_copy(update={"max_batch_size": 0})
        publish_version(repo, off, {"model.onnx": model_file})
        print(f"model: ONNX MLP 256-3500-3500-10, {model_file.stat().st_size / 1e6:.1f} MB; {a.seconds:.0f}s per point, "
              f"{a.rounds} round(s); max batch {MAX_BATCH}, no queue delay; load average {os.getloadavg()[0]:.1f} "
              f"on {os.cpu_count()} cores", flush=True)
        procs: list[subprocess.Popen] = []
        servers: dict[str, tuple[str, str]] = {}  # column -> (address, model)
        hostd = None
        extra: list[subprocess.Popen] = []
        try:
            hostd, addr = start_hostd(str(t / "store"), t, "--preload")
            servers["hostd"] = (addr, "mlp_on")
            if a.off:
                servers["hostd off"] = (addr, "mlp_off")
            for name, env in variants.items():
                hv, vaddr = start_hostd(str(t / "store"), t, "--preload", env=env)
                extra.append(hv)
                servers[name] = (vaddr, "mlp_on")
                print(f"{name}: hostd with {' '.join(f'{k}={v}' for k, v in env.items())}", flush=True)
            triton_note = "left out (--no-triton)"
            if not a.no_triton:
                tp, taddr = start_triton(model_file, t)
                if tp is None:
                    triton_note = f"NOT MEASURED: {taddr}"
                else:
                    procs.append(tp)
                    servers["triton"] = (taddr, "mlp")
                    triton_note = "nvidia-pytriton 0.7.0 (tritonserver 2.51), Python backend, onnxruntime"
            pp, paddr = start_plain(model_file, "mlp", t)
            procs.append(pp)
            servers["plain"] = (paddr, "mlp")
            print(f"Triton's core: {triton_note}", flush=True)
            x = np.random.default_rng(0).random((1, 256), dtype=np.float32)
            runs: dict[tuple[str, int], list[dict]] = {}
            for rnd in range(a.rounds):
                for c in levels:
                    for name, (saddr, model) in servers.items():
                        r = asyncio.run(closed_loop(saddr, model, "input", x, c, a.seconds, keep_latencies=True))
                        runs.setdefault((name, c), []).append(r)
                        print(f"  round {rnd + 1} c{c:<3} {name:<12} {r['rps']:7.0f} req/s  p50 {r['p50']:7.2f} ms  "
                              f"p99 {r['p99']:7.2f} ms" + (f"  errors {r['errors']}" if r["errors"] else ""), flush=True)
        finally:
            for p in procs:
                stop_group(p)
            for hp in [hostd, *extra]:
                if hp is not None:
                    stop(hp)
    res = {k: pooled(v, a.seconds) for k, v in runs.items()}
    names = list(servers)
    print()
    print(f"{'conc':>5} | " + " | ".join(f"{n + ' req/s':>14} {'p50':>7} {'p99':>7}" for n in names))
    for c in levels:
        print(f"{c:>5} | " + " | ".join(f"{res[n, c]['rps']:14.0f} {res[n, c]['p50']:7.2f} {res[n, c]['p99']:7.2f}"
                                        for n in names))
    errors = {k: r["errors"] for k, r in res.items() if r["errors"]}
    if errors:
        print(f"errors: {errors}")
    print()
    if 32 in levels:
        h = res["hostd", 32]
        if "triton" in servers:
            tr = res["triton", 32]
            ratio = h["rps"] / tr["rps"]
            print(f"hostd throughput, concurrency 32: {h['rps']:.0f} req/s, p99 {h['p99']:.1f} ms; Triton's core "
                  f"{tr['rps']:.0f} req/s, p99 {tr['p99']:.1f} ms: {ratio:.3f}x (target >= {TARGET_C32_THROUGHPUT}x: "
                  f"{verdict(ratio >= TARGET_C32_THROUGHPUT)}), p99 {h['p99'] / tr['p99']:.3f}x of Triton's "
                  f"(target <= 1.00x: {verdict(h['p99'] <= tr['p99'])}); throughput {per_round(runs, 'hostd', 'triton', 32, 'rps')}")
        else:
            print(f"hostd throughput, concurrency 32: {h['rps']:.0f} req/s, p99 {h['p99']:.1f} ms; Triton's core "
                  f"{triton_note}: target (>= {TARGET_C32_THROUGHPUT}x Triton's core) NOT EVALUATED")
        print(f"  (plain per-request server at concurrency 32: {res['plain', 32]['rps']:.0f} req/s; hostd "
              f"{h['rps'] / res['plain', 32]['rps']:.2f}x of it)")
    if 1 in levels:
        h, p = res["hostd", 1], res["plain", 1]
        ratio = h["p50"] / p["p50"]
        print(f"hostd p50, concurrency 1: {h['p50']:.2f} ms; plain per-request server {p['p50']:.2f} ms: {ratio:.3f}x "
              f"(target <= {TARGET_C1_P50}x: {verdict(ratio <= TARGET_C1_P50)}); {per_round(runs, 'hostd', 'plain', 1, 'p50')}")
        if "triton" in servers:
            print(f"  (Triton's core at concurrency 1: p50 {res['triton', 1]['p50']:.2f} ms)")
        for name in variants:
            h1 = res[name, 1]
            print(f"  ({name}: p50 {h1['p50']:.2f} ms, {h1['p50'] / p['p50']:.3f}x the plain server's; "
                  f"{per_round(runs, name, 'plain', 1, 'p50')})")
    if 32 in levels and "triton" in servers:
        for name in variants:
            h1, tr = res[name, 32], res["triton", 32]
            print(f"  ({name} at concurrency 32: {h1['rps']:.0f} req/s, {h1['rps'] / tr['rps']:.3f}x Triton's core, "
                  f"p99 {h1['p99'] / tr['p99']:.3f}x of Triton's; {per_round(runs, name, 'triton', 32, 'rps')})")


if __name__ == "__main__":
    main()
