"""Fleet-wide quotas with real processes: three routers sharing one Redis hold a tenant to its rate in total
(not rate x 3), and with Redis stopped each router falls back to its share (rate / 3) and says so in
`mmhost_router_quota_mode`. Uses its own redis-server (stopped halfway), a local model store and one hostd."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from catalog.index import RedisCatalog, connect_redis
from catalog.publish import publish_version
from catalog.repository import ModelRepository
from mmhost.demo_models import build_onnx_mlp, onnx_manifest
from ground.tenancy import TenantLimits
from router.admission import Admission
from router.fleet_quota import TAKE, FleetQuota
from router.metrics import RouterMetrics
from router.quota_policy import take_tokens
from router.tenants import RedisTenants
from storage_adapters import open_storage
from tests.hostd_proc import HostdProc, metric_value
from tests.router.conftest import IN_DIM, auth, infer_request
from tests.router.router_proc import RouterProc
from tests.servers import RedisServer

RATE, BURST = 50, 5


def test_the_lua_bucket_grants_the_burst_then_says_how_long_to_wait(redis_server):
    r = connect_redis(redis_server.url)
    take = r.register_script(TAKE)
    key = f"q{uuid.uuid4().hex[:8]}:bucket:acme"
    got, wait = take(keys=[key], args=[10, 5, 3])
    assert (int(got), float(wait)) == (3, 0.0)
    got, wait = take(keys=[key], args=[10, 5, 3])
    assert int(got) == 2 and 0.25 < float(wait) <= 0.3  # 3 more tokens at 10/s, less what refilled meanwhile
    assert 0 < r.pttl(key) <= 1500


def one_host(tmp_path, tag: str, *extra_env: tuple[str, str]):
    """A redis-server of its own, acme's model in a local store, its catalog and key in Redis (rate RATE, burst
    BURST), and one hostd heartbeating there: (redis, store, env, key, quota prefix, hostd)."""
    (tmp_path / "redis").mkdir()
    redis = RedisServer(tmp_path / "redis")
    store = str(tmp_path / "store")
    build_onnx_mlp(tmp_path / "m.onnx", (IN_DIM, 16, 4))
    repo = ModelRepository(open_storage(store))
    publish_version(repo, onnx_manifest("acme", "mlp", "1", tmp_path / "m.onnx", "model.onnx"),
                    {"model.onnx": tmp_path / "m.onnx"})
    env = {"MMHOST_HOSTD_HEARTBEAT_PREFIX": f"{tag}:hosts:", "MMHOST_ROUTER_HEARTBEAT_PREFIX": f"{tag}:hosts:",
           "MMHOST_HOSTD_HEARTBEAT_INTERVAL_S": "0.2", "MMHOST_HOSTD_HEARTBEAT_TTL_S": "1.5",
           "MMHOST_ROUTER_TENANTS_PREFIX": f"{tag}:tenants:", "MMHOST_ROUTER_CATALOG_PREFIX": f"{tag}:catalog:",
           "MMHOST_ROUTER_QUOTA_PREFIX": f"{tag}:quota:", **dict(extra_env)}
    key = RedisTenants(connect_redis(redis.url), f"{tag}:tenants:").create("acme", "standard",
                                                                          {"rate": RATE, "burst": BURST})
    RedisCatalog(connect_redis(redis.url), repo, f"{tag}:catalog:").rebuild()
    hostd = HostdProc(store, tmp_path, env=env, args=["--redis", redis.url], tenant="nobody")
    return redis, store, env, key, f"{tag}:quota:", hostd


@pytest.fixture
def fleet(tmp_path):
    redis, store, env, key, prefix, hostd = one_host(tmp_path, f"f{uuid.uuid4().hex[:8]}")
    args = ["--redis", redis.url, "--store", store, "--refresh-interval", "0.2"]
    with ThreadPoolExecutor(3) as ex:
        routers = list(ex.map(lambda _: RouterProc(tmp_path, args, env=env), range(3)))
    yield redis, routers, key, prefix
    for r in routers:
        r.stop()
    hostd.stop()
    if redis.proc.poll() is None:
        redis.stop()


def drive(routers: list[RouterProc], key: str, seconds: float) -> tuple[list[int], list[int], float]:
    """One client thread per router, calling as fast as it can for `seconds`: (admitted, refused for the rate)
    per router, and the time it took."""
    ok, refused = [0] * len(routers), [0] * len(routers)
    start = threading.Barrier(len(routers) + 1)

    def client(i: int) -> None:
        req, md = infer_request("mlp"), auth(key)
        start.wait()
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                routers[i].stub.ModelInfer(req, metadata=md, timeout=5)
                ok[i] += 1
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e
                assert dict(e.trailing_metadata() or ()).get("mmhost-reason") == "quota_rate"
                refused[i] += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(routers))]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.monotonic()
    for t in threads:
        t.join()
    return ok, refused, time.monotonic() - t0


def modes(routers: list[RouterProc]) -> list[str]:
    """Each router's own quota mode (a router's port also serves its Python-lane workers', labelled lane_worker)."""
    out = []
    for r in routers:
        text = r.metrics_text()
        own = {m: metric_value(text, "mmhost_router_quota_mode", without=("lane_worker",), mode=m)
               for m in ("fleet", "local")}
        out.append("fleet" if own["fleet"] == 1 else "local" if own["local"] == 1 else "?")
    return out


def test_three_routers_hold_a_tenant_to_its_rate_in_total_and_fall_back_to_shares(fleet):
    redis, routers, key, prefix = fleet
    deadline = time.monotonic() + 20
    for r in routers:  # each router has seen the hostd, and the hostd has the model
        while True:
            try:
                r.stub.ModelInfer(infer_request("mlp"), metadata=auth(key), timeout=10)
                break
            except grpc.RpcError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
    r = connect_redis(redis.url)
    while r.zcard(prefix + "routers") < 3:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    while modes(routers) != ["fleet"] * 3:  # every router has counted 3 and talks to Redis
        assert time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(BURST / RATE)  # the shared bucket refills to its burst

    ok, refused, took = drive(routers, key, 4.0)
    rate = sum(ok) / took
    print(f"fleet: admitted {ok} refused {refused} in {took:.2f}s: {rate:.1f}/s (limit {RATE}/s)")
    assert rate == pytest.approx(RATE, rel=0.10), (ok, refused, took)
    assert sum(refused) > sum(ok)  # the clients asked for far more
    assert modes(routers) == ["fleet"] * 3

    redis.stop()
    deadline = time.monotonic() + 5
    while modes(routers) != ["local"] * 3:  # the next heartbeat (0.2 s) or lease notices
        assert time.monotonic() < deadline, modes(routers)
        time.sleep(0.1)
    time.sleep(0.2)
    ok, refused, took = drive(routers, key, 3.0)
    rates = [n / took for n in ok]
    print(f"local: admitted {ok} refused {refused} in {took:.2f}s: {[round(x, 1) for x in rates]}/s per router "
          f"(share {RATE / 3:.1f}/s)")
    for x in rates:  # each router its share, limit / 3, plus its share of the burst
        assert RATE / 3 * 0.7 < x < RATE / 3 * 1.4, rates
    assert all(r.proc.poll() is None for r in routers)
    assert "fleet quotas: Redis unreachable" in routers[0].log()


class FakeRedis:
    """The two scripts, answered by quota_policy's arithmetic on a virtual clock; `down` makes every call fail."""

    def __init__(self, clock) -> None:
        self.clock, self.down, self.routers, self.calls = clock, False, 3, 0
        self.buckets: dict[str, object] = {}

    def register_script(self, text: str):
        async def run(keys, args):
            self.calls += 1
            if self.down:
                raise ConnectionError("connection refused")
            if text == TAKE:
                g = take_tokens(self.buckets.get(keys[0]), float(args[0]), float(args[1]), int(args[2]), self.clock())
                self.buckets[keys[0]] = g.bucket
                return [g.granted, str(g.wait_s)]
            return self.routers
        return run


def test_fleet_mode_leases_then_local_shares_when_redis_fails_and_back():
    now = [100.0]
    fake = FakeRedis(lambda: now[0])
    metrics = RouterMetrics()
    fleet = FleetQuota(fake, "q:", "r1", lambda: now[0], metrics.quota_mode)
    adm = Admission({"acme": TenantLimits(rate=40, burst=4)}, fleet=fleet)

    async def call() -> bool:
        await adm.ready("acme")
        d = adm.enter("acme", now[0])
        if d.admit:
            adm.leave("acme")
        return d.admit

    async def scenario() -> None:
        await fleet.heartbeat()
        assert fleet.routers == 3 and fleet.mode == "fleet"
        got = [await call() for _ in range(10)]  # burst 4 through leases of 2, then empty
        assert got.count(True) == 4 and fake.calls <= 4
        calls = fake.calls
        assert not any([await call() for _ in range(50)]) and fake.calls == calls  # refused without Redis
        now[0] += 0.05  # 2 tokens at 40/s
        assert [await call() for _ in range(3)] == [True, True, False]
        fake.down = True
        now[0] += 1.0
        await call()
        assert fleet.mode == "local" and metrics.quota_mode.labels("local")._value.get() == 1
        now[0] += 10.0  # the local share: 40/3 per s, burst ceil(4/3) = 2
        assert [await call() for _ in range(3)] == [True, True, False]
        await fleet.heartbeat()
        assert fleet.mode == "local"
        fake.down = False
        await fleet.heartbeat()
        assert fleet.mode == "fleet" and metrics.quota_mode.labels("fleet")._value.get() == 1

    asyncio.run(scenario())


def test_a_router_with_lane_workers_counts_once_and_keeps_the_tenants_whole_share_when_redis_is_down(tmp_path):
    """A router with a Python-lane worker (fast lane on, Redis mode) is one router among the live routers, not
    two: a tenant's calls are on one of its processes at a time, so counting the worker would halve each limit
    there (concurrency always, rate when Redis is down). The worker talks to Redis (fleet mode on its own
    metrics) and the routers' set still holds one name; with Redis stopped, the tenant gets the whole rate."""
    redis, store, env, key, prefix, hostd = one_host(tmp_path, f"w{uuid.uuid4().hex[:8]}",
                                                     ("MMHOST_ROUTER_FAST_LANE_CHECK_INTERVAL_S", "0.2"))
    router = RouterProc(tmp_path, ["--redis", redis.url, "--store", store, "--refresh-interval", "0.2",
                                   "--fast-lane", "haproxy", "--fast-lane-workers", "1"], env=env)
    try:
        deadline = time.monotonic() + 30
        while True:  # the router has seen the hostd, and the hostd has the model
            try:
                router.stub.ModelInfer(infer_request("mlp"), metadata=auth(key), timeout=10)
                break
            except grpc.RpcError as e:
                assert e.code() != grpc.StatusCode.RESOURCE_EXHAUSTED, e
                assert time.monotonic() < deadline, router.log()
                time.sleep(0.1)

        def worker_mode() -> str:  # the worker's series, through the router's port
            return "fleet" if metric_value(router.metrics_text(), "mmhost_router_quota_mode", mode="fleet",
                                           lane_worker="1") == 1 else "?"

        r = connect_redis(redis.url)
        while worker_mode() != "fleet" or modes([router]) != ["fleet"]:  # both have heartbeated into the set
            assert time.monotonic() < deadline, router.log()
            time.sleep(0.1)
        for _ in range(10):  # over several heartbeats of both (0.2 s)
            assert r.zcard(prefix + "routers") == 1, r.zrange(prefix + "routers", 0, -1)
            time.sleep(0.1)

        for _ in range(20):  # the tenant's lane is settled and its process knows the model (it knows it while
            router.stub.ModelInfer(infer_request("mlp"), metadata=auth(key), timeout=10)  # Redis is down)
            time.sleep(0.05)
        redis.stop()
        while worker_mode() == "fleet" or modes([router]) != ["local"]:
            assert time.monotonic() < deadline + 10, router.log()
            time.sleep(0.1)
        time.sleep(BURST / RATE)
        (ok,), _, took = drive([router], key, 3.0)
        rate = ok / took
        print(f"local, with a worker: admitted {ok} in {took:.2f}s: {rate:.1f}/s (limit {RATE}/s)")
        assert RATE * 0.75 < rate < RATE * 1.3, rate  # counted twice, it would be RATE / 2
    finally:
        router.stop()
        hostd.stop()
        if redis.proc.poll() is None:
            redis.stop()
