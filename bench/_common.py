"""Shared by the benchmarks: start a real hostd process, run a closed-loop Triton asyncio client."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ground.serving import wait_serving as wait
from tests.servers import free_port

ROOT = Path(__file__).resolve().parent.parent
__all__ = ["ROOT", "PLAINTEXT_DEV", "free_port", "wait_serving", "start_hostd", "stop", "wait_model_ready", "closed_loop", "s3_with_model"]
# what benches' hostds and routers run with (no certificates; direct hostd calls act as the default tenant)
PLAINTEXT_DEV = {"MMHOST_HOSTD_PLAINTEXT": "true", "MMHOST_HOSTD_DEV_MODE": "true", "MMHOST_ROUTER_PLAINTEXT": "true"}


def wait_serving(addr: str, proc: subprocess.Popen, timeout: float = 60) -> None:
    wait(addr, proc, "server", timeout=timeout)


def wait_model_ready(addr: str, model: str, proc: subprocess.Popen, log: Path, timeout: float) -> None:
    """Poll v2 ModelReady until the model is ready; RuntimeError with the log's tail if the process exits."""
    import tritonclient.grpc as gc

    client = gc.InferenceServerClient(addr)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"exited with {proc.returncode}: {log.read_text(errors='replace')[-1500:]}")
            try:
                if client.is_model_ready(model):
                    return
            except Exception:  # noqa: BLE001 - not listening yet
                pass
            time.sleep(0.2)
    finally:
        client.close()
    raise TimeoutError(f"{model} on {addr} not ready after {timeout:.0f}s: {log.read_text(errors='replace')[-1500:]}")


def start_hostd(store: str, workdir: Path, *args: str, env: dict | None = None,
                launcher: tuple[str, ...] = ("-m", "mmhost.cli"), health_port: int = 0) -> tuple[subprocess.Popen, str]:
    """`launcher`: what runs hostd's CLI (bench/hostd_twin.py wraps it). `health_port`: a hostd with TLS (env)
    is waited for on its plaintext health port."""
    port = free_port()
    addr = f"127.0.0.1:{port}"
    log = open(workdir / f"hostd-{port}.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, *launcher, "hostd", "--listen", addr, "--store", store, "--metrics-port", "0",
         "--cache-dir", str(workdir / f"cache-{port}"), "--log-level", "WARNING", *args],
        # plaintext, and dev mode: benches call hostds directly, without mmhost-tenant (the default tenant)
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **PLAINTEXT_DEV, **(env or {})},
    )
    wait_serving(f"127.0.0.1:{health_port}" if health_port else addr, proc)
    return proc, addr


def start_plain(model_file: Path, name: str, workdir: Path, new_session: bool = True) -> tuple[subprocess.Popen, str]:
    """bench/plain_server.py serving `model_file` as `name`: one ORT session on its own event loop, nothing of
    hostd's (no batcher, no slots, no tenancy). In a session of its own by default, so that both `stop` and
    bench/batching.py's `stop_group` end it; `new_session=False` keeps it in this process's session, where
    bench/noisy_model.py's hostd and clients are: with the kernel's autogroup scheduling (sched_autogroup_enabled,
    on in most distributions) every session is a scheduling group, and groups share contended cores equally, so
    a server in a session of its own would get half the cores against everything else in the bench."""
    port = free_port()
    addr = f"127.0.0.1:{port}"
    log = workdir / f"plain-{port}.log"
    proc = subprocess.Popen([sys.executable, "-m", "bench.plain_server", addr, str(model_file), name],
                            cwd=ROOT, stdout=open(log, "wb"), stderr=subprocess.STDOUT, start_new_session=new_session)
    wait_model_ready(addr, name, proc, log, timeout=120)
    return proc, addr


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process, all its threads (psutil.NoSuchProcess once it is gone)."""
    import psutil

    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


async def closed_loop(addr: str, model: str, input_name: str, x: np.ndarray, concurrency: int, seconds: float,
                      warmup_s: float = 0.5, headers: dict | None = None, keep_latencies: bool = False,
                      client_kw: dict | None = None) -> dict:
    """`concurrency` workers each send one request, wait for the answer, repeat. Returns throughput
    (requests/s) and latency percentiles (ms) measured after the warm-up, `n` the requests answered then, and
    `sent` every request sent, warm-up and errors included; with `keep_latencies`, also each request's latency
    in seconds (`lat`, to pool several runs). `client_kw`: more InferenceServerClient arguments (TLS)."""
    import tritonclient.grpc.aio as ga

    client = ga.InferenceServerClient(addr, **(client_kw or {}))
    inp = ga.InferInput(input_name, list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    lat: list[float] = []
    errors = sent = 0
    start = time.perf_counter()
    measure_from = start + warmup_s
    end = measure_from + seconds

    async def worker() -> None:
        nonlocal errors, sent
        while True:
            t0 = time.perf_counter()
            if t0 >= end:
                return
            sent += 1
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
    out = {"rps": len(lat) / seconds, "p50": float(np.percentile(arr, 50)), "p99": float(np.percentile(arr, 99)),
           "errors": errors, "n": len(lat), "sent": sent}
    if keep_latencies:
        out["lat"] = np.array(lat)
    return out


@dataclass
class S3Model:
    store: str  # s3://bucket/models
    endpoint: str
    bucket: str
    key: str  # the model file's object key
    client: object  # a boto3 S3 client on the endpoint


@contextmanager
def s3_with_model(model_file: Path, tenant: str = "demo", model: str = "mlp") -> Iterator[S3Model]:
    """A moto_server process (S3-compatible, localhost) holding one model uploaded with `mmhost upload`'s
    code; stopped on exit."""
    import uuid

    import boto3

    from ground.settings import S3Settings
    from mmhost.upload import UploadRequest, upload
    from storage_adapters.factory import open_storage
    from catalog.repository import ModelRepository
    from tests.servers import MotoServer

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    srv = MotoServer()
    try:
        bucket = f"bench-{uuid.uuid4().hex[:8]}"
        client = boto3.session.Session().client("s3", endpoint_url=srv.endpoint, region_name="us-east-1")
        client.create_bucket(Bucket=bucket)
        store = f"s3://{bucket}/models"
        m = upload(ModelRepository(open_storage(store, S3Settings(endpoint_url=srv.endpoint))),
                   UploadRequest(tenant=tenant, model=model, file=model_file))
        key = f"models/tenants/{tenant}/models/{model}/{m.version}/{m.model_file}"
        yield S3Model(store, srv.endpoint, bucket, key, client)
    finally:
        srv.stop()
