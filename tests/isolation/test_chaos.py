"""Chaos, bounded and seeded: a dedicated redis-server and moto_server, two hostds and a router in Redis mode.
(a) tenant B's corrupt model requested while tenant A's warm model is under load; (b) Redis paused with
SIGSTOP under load; (c) S3 paused with SIGSTOP: loaded models serve, a cold one fails fast with UNAVAILABLE; (d) Redis FLUSHALL under
load: no key stops working, nothing fails, and `mmhost catalog rebuild` brings every tenant and model back.
Strict targets (>= 90% throughput, cold fail < 5 s) are printed by bench/chaos.py; here, generous ratios."""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import grpc
import pytest

from catalog.index import RedisCatalog, connect_redis
from catalog.publish import publish_version
from catalog.repository import ModelRepository
from catalog.tenants_store import TenantStore
from ground.settings import S3Settings
from mmhost.demo_models import build_onnx_mlp, onnx_manifest
from router.tenants import RedisTenants
from storage_adapters import open_storage
from storage_adapters.s3 import S3Storage
from tests.hostd_proc import HostdProc
from tests.router.conftest import IN_DIM, auth, infer_request
from tests.router.router_proc import RouterProc
from tests.servers import MotoServer, RedisServer
from tests.storage.conftest import make_bucket


def metric(r: RouterProc, name: str) -> float:
    for line in r.metrics_text().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


class Chaos(NamedTuple):
    redis: RedisServer
    moto: MotoServer
    router: RouterProc
    keys: dict[str, str]
    procs: list
    store: str  # the model store's URI (tenant records live there too)
    env: dict[str, str]  # the processes' environment: S3 endpoint and this cluster's Redis prefixes


@contextmanager
def chaos_cluster(work: Path):
    """redis-server, moto_server, 2 hostds and a router in Redis mode; acme's `warm` loaded, `cold` not,
    globex's `broken` corrupt in storage; tenants durable (records in the store, Redis their index).
    Yields a Chaos (redis, moto, router, keys, procs, store, env)."""
    (work / "redis").mkdir()
    redis = RedisServer(work / "redis")
    moto = MotoServer()
    procs: list = []
    try:
        s3 = S3Settings(endpoint_url=moto.endpoint)
        store = f"s3://{make_bucket(moto.endpoint)}/store"
        repo = ModelRepository(open_storage(store, s3))
        build_onnx_mlp(work / "a.onnx", (IN_DIM, 16, 4))
        for tenant, name in [("acme", "warm"), ("acme", "cold"), ("globex", "broken")]:
            publish_version(repo, onnx_manifest(tenant, name, "1", work / "a.onnx", "model.onnx"),
                            {"model.onnx": work / "a.onnx"})
        raw = S3Storage.from_uri(store, s3)
        key = "tenants/globex/models/broken/1/model.onnx"
        data = raw.read_bytes(key)
        raw.put_bytes(key, data[:100] + bytes([data[100] ^ 0xFF]) + data[101:])  # same size, sha256 fails
        tag = uuid.uuid4().hex[:8]
        env = {"MMHOST_S3_ENDPOINT_URL": moto.endpoint,
               "MMHOST_HOSTD_HEARTBEAT_PREFIX": f"c{tag}:hosts:", "MMHOST_HOSTD_HEARTBEAT_INTERVAL_S": "0.2",
               "MMHOST_HOSTD_HEARTBEAT_TTL_S": "1.5", "MMHOST_ROUTER_HEARTBEAT_PREFIX": f"c{tag}:hosts:",
               "MMHOST_ROUTER_TENANTS_PREFIX": f"c{tag}:tenants:", "MMHOST_ROUTER_CATALOG_PREFIX": f"c{tag}:catalog:"}
        reg = RedisTenants(connect_redis(redis.url), f"c{tag}:tenants:", TenantStore(raw))
        keys = {t: reg.create(t) for t in ("acme", "globex")}
        RedisCatalog(connect_redis(redis.url), repo, f"c{tag}:catalog:").rebuild()
        with ThreadPoolExecutor(2) as ex:
            procs += list(ex.map(lambda _: HostdProc(store, work, env=env, args=["--redis", redis.url],
                                                       tenant="nobody"), range(2)))
        router = RouterProc(work, ["--redis", redis.url, "--store", store, "--refresh-interval", "0.2"], env)
        procs.append(router)
        deadline = time.monotonic() + 20
        while metric(router, "mmhost_router_hosts_up") < 2:
            assert time.monotonic() < deadline, router.log()
            time.sleep(0.1)
        router.stub.ModelInfer(infer_request("warm"), metadata=auth(keys["acme"]), timeout=30)
        yield Chaos(redis, moto, router, keys, procs, store, env)
    finally:
        for p in procs:
            p.stop()
        for s in (redis, moto):
            try:
                os.kill(s.proc.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
            s.stop()


@pytest.fixture(scope="module")
def chaos(tmp_path_factory):
    with chaos_cluster(tmp_path_factory.mktemp("chaos")) as c:
        yield c


def load(router: RouterProc, key: str, seconds: float, threads: int = 4) -> tuple[int, list[str]]:
    """Closed loop on acme's warm model: (served, errors)."""
    served, errors, stop = [0], [], time.monotonic() + seconds
    lock = threading.Lock()

    def run() -> None:
        while time.monotonic() < stop:
            try:
                router.stub.ModelInfer(infer_request("warm"), metadata=auth(key), timeout=10)
                with lock:
                    served[0] += 1
            except grpc.RpcError as e:
                with lock:
                    errors.append(f"{e.code()}: {e.details()}")

    ts = [threading.Thread(target=run) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(seconds + 30)
    return served[0], errors


def test_a_broken_model_of_b_does_not_reach_a(chaos):
    router, keys, procs = chaos.router, chaos.keys, chaos.procs
    down0 = metric(router, "mmhost_router_hosts_marked_down_total")
    result: dict = {}
    t = threading.Thread(target=lambda: result.update(r=load(router, keys["acme"], 3.0)))
    t.start()
    codes = []
    t0 = time.monotonic()
    while time.monotonic() - t0 < 2.5:
        try:
            router.stub.ModelInfer(infer_request("broken"), metadata=auth(keys["globex"]), timeout=10)
            codes.append("OK")
        except grpc.RpcError as e:
            codes.append((e.code(), e.details(), dict(e.trailing_metadata() or ()).get("retry-after-ms")))
        time.sleep(0.05)
    t.join(40)
    served, errors = result["r"]
    assert errors == [] and served > 10
    assert codes and all(c != "OK" and c[0] == grpc.StatusCode.UNAVAILABLE for c in codes), codes[:3]
    # every answer, the first one (to the callers that waited on the failed load) included, says when to retry
    assert all(c[2] and int(c[2]) > 0 for c in codes), codes[:3]
    assert any("load_failed" in c[1] or "sha256" in c[1] for c in codes), codes[:3]
    assert metric(router, "mmhost_router_hosts_marked_down_total") == down0
    assert metric(router, "mmhost_router_hosts_up") == 2
    assert all(p.proc.poll() is None for p in procs)


def _paused(server, seconds: float, router, key) -> tuple[int, list[str]]:
    os.kill(server.proc.pid, signal.SIGSTOP)
    try:
        return load(router, key, seconds)
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)


def test_redis_paused_loaded_model_keeps_serving(chaos):
    redis, router, keys = chaos.redis, chaos.router, chaos.keys
    calm, errs = load(router, keys["acme"], 2.0)
    assert errs == []
    served, errors = _paused(redis, 3.0, router, keys["acme"])
    print(f"redis paused: calm {calm / 2.0:.0f}/s paused {served / 3.0:.0f}/s")
    assert errors == [], errors[:3]
    assert served / 3.0 >= 0.5 * calm / 2.0
    deadline = time.monotonic() + 5.0  # the router's view refreshes every 0.5 s: poll, do not sleep
    while metric(router, "mmhost_router_hosts_up") != 2:
        assert time.monotonic() < deadline, "a Redis pause must not leave a host marked down"
        time.sleep(0.1)


def test_s3_paused_loaded_models_serve_cold_fails_fast(chaos):
    moto, router, keys = chaos.moto, chaos.router, chaos.keys
    calm, errs = load(router, keys["acme"], 2.0)
    assert errs == []
    os.kill(moto.proc.pid, signal.SIGSTOP)
    try:
        result: dict = {}
        t = threading.Thread(target=lambda: result.update(r=load(router, keys["acme"], 3.0)))
        t.start()
        t0 = time.monotonic()
        with pytest.raises(grpc.RpcError) as ei:
            router.stub.ModelInfer(infer_request("cold"), metadata=auth(keys["acme"]), timeout=20)
        cold_s = time.monotonic() - t0
        t.join(40)
    finally:
        os.kill(moto.proc.pid, signal.SIGCONT)
    served, errors = result["r"]
    print(f"s3 paused: calm {calm / 2.0:.0f}/s paused {served / 3.0:.0f}/s cold failed in {cold_s:.2f}s "
          f"{ei.value.code()} {ei.value.details()}")
    assert errors == [], errors[:3]
    assert served / 3.0 >= 0.5 * calm / 2.0
    assert ei.value.code() == grpc.StatusCode.UNAVAILABLE, ei.value.details()
    assert cold_s < 6.0  # storage_down is not retried on the other host: one 3 s storage bound, not two (the
    # issue's 5 s target is printed by bench/chaos.py; this bound only leaves room for a loaded machine)


def flushall_under_load(c: Chaos, seconds: float) -> tuple[int, list[str], list[str]]:
    """FLUSHALL once acme's load runs; globex asks for its (broken) model meanwhile: acme's (served, errors),
    and globex's UNAUTHENTICATED answers (its key must keep working while Redis is empty)."""
    result: dict = {}
    t = threading.Thread(target=lambda: result.update(r=load(c.router, c.keys["acme"], seconds)))
    t.start()
    connect_redis(c.redis.url).flushall()
    unauth = []
    end = time.monotonic() + seconds - 0.5
    while time.monotonic() < end:
        try:
            c.router.stub.ModelInfer(infer_request("broken"), metadata=auth(c.keys["globex"]), timeout=10)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.UNAUTHENTICATED:
                unauth.append(e.details())
        time.sleep(0.05)
    t.join(seconds + 30)
    served, errors = result["r"]
    return served, errors, unauth


def rebuild(c: Chaos) -> str:
    """`mmhost catalog rebuild`, as an operator runs it (a process), with this cluster's prefixes."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "mmhost.cli", "catalog", "rebuild", "--store", c.store,
                          "--redis", c.redis.url], env={**os.environ, **c.env}, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_flushall_under_load_loses_nothing_and_rebuild_restores_everything(chaos):
    """Last in this module: it empties Redis (and rebuilds it)."""
    served, errors, unauth = flushall_under_load(chaos, 3.0)
    assert errors == [] and served > 10, errors[:3]
    assert unauth == [], unauth[:3]
    r = connect_redis(chaos.redis.url)
    assert not r.keys(f"{chaos.env['MMHOST_ROUTER_TENANTS_PREFIX']}*")
    out = rebuild(chaos)
    assert "tenants:" in out, out
    tenants = RedisTenants(r, chaos.env["MMHOST_ROUTER_TENANTS_PREFIX"])
    assert {t.name for t in tenants.list()} == {"acme", "globex"}
    cat = RedisCatalog(r, ModelRepository(open_storage(chaos.store, S3Settings(endpoint_url=chaos.moto.endpoint))),
                       chaos.env["MMHOST_ROUTER_CATALOG_PREFIX"])
    assert cat.ready() and cat.models("acme") == ["cold", "warm"] and cat.models("globex") == ["broken"]
    # every model is served again, the one no host had loaded included, and both hosts are up
    for model in ("warm", "cold"):
        chaos.router.stub.ModelInfer(infer_request(model), metadata=auth(chaos.keys["acme"]), timeout=30)
    deadline = time.monotonic() + 5.0
    while metric(chaos.router, "mmhost_router_hosts_up") != 2:
        assert time.monotonic() < deadline, "heartbeats must come back after a FLUSHALL"
        time.sleep(0.1)
