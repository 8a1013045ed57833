"""Redis down in cluster mode: routers and hostds keep serving what they know; what they cannot know gets a
clear UNAVAILABLE; nothing hangs. Uses its own redis-server, stopped halfway."""

from __future__ import annotations

import time
import uuid

import grpc
import pytest

from catalog.index import RedisCatalog, connect_redis
from ground.settings import S3Settings
from router.tenants import RedisTenants
from storage_adapters import open_storage
from catalog.repository import ModelRepository
from tests.hostd_proc import HostdProc
from tests.router.conftest import auth, infer_request
from tests.router.router_proc import RouterProc
from tests.servers import RedisServer


@pytest.fixture
def small_cluster(cluster, tmp_path, s3_server):
    (tmp_path / "redis").mkdir()
    redis = RedisServer(tmp_path / "redis")
    tag = uuid.uuid4().hex[:8]
    env = {**cluster.env,
           "MMHOST_HOSTD_HEARTBEAT_PREFIX": f"d{tag}:hosts:", "MMHOST_ROUTER_HEARTBEAT_PREFIX": f"d{tag}:hosts:",
           "MMHOST_ROUTER_TENANTS_PREFIX": f"d{tag}:tenants:", "MMHOST_ROUTER_CATALOG_PREFIX": f"d{tag}:catalog:",
           "MMHOST_ROUTER_CATALOG_TTL_S": "0.3"}  # lookups expire while Redis is down
    key = RedisTenants(connect_redis(redis.url), f"d{tag}:tenants:").create("acme")
    repo = ModelRepository(open_storage(cluster.store, S3Settings(endpoint_url=s3_server.endpoint)))
    RedisCatalog(connect_redis(redis.url), repo, f"d{tag}:catalog:").rebuild()
    hostd = HostdProc(cluster.store, tmp_path, env=env, args=["--redis", redis.url], tenant="nobody")
    router = RouterProc(tmp_path, ["--redis", redis.url, "--store", cluster.store, "--refresh-interval", "0.2"], env=env)
    yield redis, hostd, router, key
    router.stop()
    hostd.stop()
    if redis.proc.poll() is None:
        redis.stop()


def test_redis_down_keeps_known_traffic_flowing(small_cluster):
    redis, hostd, router, key = small_cluster
    deadline = time.monotonic() + 20
    while True:  # the router has seen the hostd's heartbeat
        try:
            router.stub.ModelInfer(infer_request("m00"), metadata=auth(key), timeout=10)
            break
        except grpc.RpcError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    redis.stop()
    time.sleep(0.05)
    t0 = time.monotonic()
    served = 0
    while time.monotonic() - t0 < 1.5:  # well past the lookup TTL: a known model, tenant and host still serve
        assert router.stub.ModelInfer(infer_request("m00"), metadata=auth(key), timeout=10).outputs
        served += 1
    assert served > 5
    with pytest.raises(grpc.RpcError) as ei:  # never looked up before: cannot be checked now
        router.stub.ModelInfer(infer_request("m05"), metadata=auth(key), timeout=10)
    assert ei.value.code() == grpc.StatusCode.UNAVAILABLE and "catalog unavailable" in ei.value.details()
    assert dict(ei.value.trailing_metadata()).get("retry-after-ms")
    assert time.monotonic() - t0 < 15  # clear answers, no hangs
    assert hostd.proc.poll() is None and "heartbeat" in hostd.log()
