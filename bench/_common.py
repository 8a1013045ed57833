"""Shared by the benchmarks: start a real hostd process, run a closed-loop Triton asyncio client."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_serving(addr: str, proc: subprocess.Popen, timeout: float = 60) -> None:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    ch = grpc.insecure_channel(addr)
    stub = health_pb2_grpc.HealthStub(ch)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if stub.Check(health_pb2.HealthCheckRequest(), timeout=1).status == 1:
                ch.close()
                return
        except grpc.RpcError:
            pass
        time.sleep(0.05)
    raise TimeoutError(addr)


def start_hostd(store: str, workdir: Path, *args: str, env: dict | None = None) -> tuple[subprocess.Popen, str]:
    port = free_port()
    addr = f"127.0.0.1:{port}"
    log = open(workdir / f"hostd-{port}.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mmhost.cli", "hostd", "--listen", addr, "--store", store, "--metrics-port", "0",
         "--cache-dir", str(workdir / f"cache-{port}"), "--log-level", "WARNING", *args],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
    )
    wait_serving(addr, proc)
    return proc, addr


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


async def closed_loop(addr: str, model: str, input_name: str, x: np.ndarray, concurrency: int, seconds: float,
                      warmup_s: float = 0.5, headers: dict | None = None) -> dict:
    """`concurrency` workers each send one request, wait for the answer, repeat. Returns throughput
    (requests/s) and latency percentiles (ms) measured after the warm-up."""
    import tritonclient.grpc.aio as ga

    client = ga.InferenceServerClient(addr)
    inp = ga.InferInput(input_name, list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    lat: list[float] = []
    errors = 0
    start = time.perf_counter()
    measure_from = start + warmup_s
    end = measure_from + seconds

    async def worker() -> None:
        nonlocal errors
        while True:
            t0 = time.perf_counter()
            if t0 >= end:
                return
            try:
                await client.infer(model, [inp], headers=headers)
            except Exception:  # noqa: BLE001 - counted, reported
                errors += 1
                continue
            t1 = time.perf_counter()
            if t0 >= measure_from:
                lat.append(t1 - t0)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    await client.close()
    arr = np.array(lat) * 1000 if lat else np.array([float("nan")])
    return {"rps": len(lat) / seconds, "p50": float(np.percentile(arr, 50)), "p99": float(np.percentile(arr, 99)),
            "errors": errors, "n": len(lat)}
