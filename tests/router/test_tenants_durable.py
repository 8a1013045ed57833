"""Tenants are durable: each tenant's record (key hash and limits) lives in the model store, Redis indexes it,
`mmhost tenant rebuild` / `mmhost catalog rebuild` restore the index, and routers keep serving the last
tenant set they knew while Redis is flushed, slow or down. Real redis-server (one per test: they FLUSHALL,
pause and stop it) and moto_server; tenants made through the CLI code path."""

from __future__ import annotations

import asyncio
import json
import time

import grpc
import pytest
from typer.testing import CliRunner

from catalog.index import connect_redis
from catalog.tenants_store import TenantStore
from ground.settings import S3Settings
from ground.tenancy import TIERS
from mmhost.cli import app
from protos import grpc_service_pb2 as pb
from router.auth import hash_key
from router.tenants import RedisTenants, TenantFeed, TenantRecord, next_known
from tests.router.conftest import auth
from tests.router.router_proc import RouterProc
from tests.servers import RedisServer
from tests.storage.conftest import make_bucket

PREFIX = "mmhost:tenants:"


@pytest.fixture
def redis(tmp_path):
    (tmp_path / "redis").mkdir()
    srv = RedisServer(tmp_path / "redis")
    yield srv
    if srv.proc.poll() is None:
        srv.stop()


@pytest.fixture
def store(s3_server) -> str:
    return f"s3://{make_bucket(s3_server.endpoint)}/store"


@pytest.fixture
def mm(s3_server):
    """`mmhost ...` in-process; returns its output, checking the exit code."""

    def run(*args: str, code: int = 0) -> str:
        res = CliRunner().invoke(app, [str(a) for a in args], env={"MMHOST_S3_ENDPOINT_URL": s3_server.endpoint})
        assert res.exit_code == code, res.output
        return res.output

    return run


def key_of(output: str) -> str:
    return next(line for line in output.splitlines() if line.startswith("mmk_"))


def tenant_store(store: str, s3_server) -> TenantStore:
    return TenantStore.open(store, S3Settings(endpoint_url=s3_server.endpoint))


def indexed(url: str) -> dict[str, TenantRecord]:
    return RedisTenants(connect_redis(url), PREFIX).snapshot()[1]


def make_tenants(mm, store: str, url: str) -> dict[str, str]:
    keys = {"acme": key_of(mm("tenant", "create", "acme", "--tier", "premium", "--rate", "50",
                              "--store", store, "--redis", url)),
            "globex": key_of(mm("tenant", "create", "globex", "--tier", "free", "--store", store, "--redis", url)),
            "initech": key_of(mm("tenant", "create", "initech", "--store", store, "--redis", url))}
    mm("tenant", "set-limits", "globex", "--max-concurrency", "3", "--store", store, "--redis", url)
    return keys


def test_records_live_in_the_store_and_rebuild_restores_redis_after_flushall(mm, redis, store, s3_server):
    keys = make_tenants(mm, store, redis.url)
    ts = tenant_store(store, s3_server)
    stored = ts.all()
    assert sorted(stored) == ["acme", "globex", "initech"]
    for name, key in keys.items():
        assert stored[name]["key_sha256"] == hash_key(key)
        raw = ts.storage.read_bytes(f"tenants/{name}/tenant.json").decode()
        assert key not in raw and key[4:] not in raw  # hashes only, never a key
    assert stored["globex"]["limits"] == {"tier": "free", "max_concurrency": 3}
    before = indexed(redis.url)
    assert {n: r.key_sha256 for n, r in before.items()} == {n: hash_key(k) for n, k in keys.items()}

    r = connect_redis(redis.url)
    r.flushall()
    assert indexed(redis.url) == {}
    out = mm("tenant", "rebuild", "--store", store, "--redis", redis.url)
    assert "indexed 3 tenant(s) from the store (3 Redis had lost" in out
    assert indexed(redis.url) == before  # every tenant, key hash and limits
    assert r.exists(PREFIX + "ready") and r.hgetall(PREFIX + "by-hash") == {hash_key(k): n for n, k in keys.items()}
    lim = indexed(redis.url)["acme"].limits
    assert (lim.tier, lim.rate, lim.burst) == ("premium", 50, TIERS["premium"].burst)

    # `mmhost catalog rebuild` restores tenants too
    r.flushall()
    out = mm("catalog", "rebuild", "--store", store, "--redis", redis.url)
    assert "tenants: indexed 3 tenant(s)" in out
    assert indexed(redis.url) == before

    # a write that finds the index lost rebuilds it whole from the store, never leaving one tenant in it
    r.flushall()
    mm("tenant", "create", "hooli", "--store", store, "--redis", redis.url)
    assert sorted(indexed(redis.url)) == ["acme", "globex", "hooli", "initech"]
    assert r.exists(PREFIX + "ready")

    listing = mm("tenant", "list", "--store", store)  # the store alone: works with Redis gone
    assert all(n in listing for n in ("acme", "globex", "hooli", "initech")) and keys["acme"] not in listing


def test_a_rotated_key_stays_dead_after_rebuild_because_the_store_holds_the_truth(mm, redis, store):
    keys = make_tenants(mm, store, redis.url)
    r = connect_redis(redis.url)
    stale = r.hget(PREFIX + "by-name", "acme")  # what a lagging replica or a restored snapshot would hold
    new_key = key_of(mm("tenant", "rotate-key", "acme", "--store", store, "--redis", redis.url))
    r.hset(PREFIX + "by-name", "acme", stale)
    r.hset(PREFIX + "by-hash", hash_key(keys["acme"]), "acme")
    mm("tenant", "rebuild", "--store", store, "--redis", redis.url)
    by_hash = r.hgetall(PREFIX + "by-hash")
    assert hash_key(keys["acme"]) not in by_hash and by_hash[hash_key(new_key)] == "acme"
    assert indexed(redis.url)["acme"].key_sha256 == hash_key(new_key)

    # a tenant deleted from the store but left in Redis is reported, and removed with --prune
    mm("tenant", "delete", "initech", "--store", store)  # store only: Redis still has it
    assert "initech" in indexed(redis.url)
    assert "kept 1 tenant(s) that only Redis has" in mm("tenant", "rebuild", "--store", store, "--redis", redis.url)
    out = mm("tenant", "rebuild", "--store", store, "--redis", redis.url, "--prune")
    assert "removed 1 tenant(s) the store does not have: initech" in out
    assert sorted(indexed(redis.url)) == ["acme", "globex"]


def test_export_import_round_trip_keeps_keys_and_limits(mm, redis, tmp_path, store, s3_server):
    keys = make_tenants(mm, store, redis.url)
    f = tmp_path / "tenants.json"
    mm("tenant", "export", str(f), "--store", store)
    body = f.read_text()
    assert all(k not in body for k in keys.values())
    assert f.stat().st_mode & 0o077 == 0
    exported = json.loads(body)["tenants"]
    assert {n: d["key_sha256"] for n, d in exported.items()} == {n: hash_key(k) for n, k in keys.items()}

    (tmp_path / "redis2").mkdir()
    redis2 = RedisServer(tmp_path / "redis2")
    try:
        store2 = f"s3://{make_bucket(s3_server.endpoint)}/store"
        assert "imported 3 tenant(s)" in mm("tenant", "import", str(f), "--store", store2, "--redis", redis2.url)
        assert indexed(redis2.url) == indexed(redis.url)  # same key hashes (the same keys work), same limits
        assert tenant_store(store2, s3_server).all() == tenant_store(store, s3_server).all()
        assert connect_redis(redis2.url).exists(PREFIX + "ready")
    finally:
        redis2.stop()
    # the export is also an embedded-mode tenants file
    assert "tier premium" in mm("tenant", "list", "--tenants", str(f))

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"tenants": {"x": {"key_sha256": keys["acme"], "created": 1}}}))
    assert "not a sha256 hex digest" in mm("tenant", "import", str(bad), "--store", store, code=1)


def test_tenants_made_without_a_store_move_into_it(mm, redis, tmp_path, store, s3_server):
    out = mm("tenant", "create", "legacy", "--redis", redis.url)
    assert "kept only in Redis" in out
    key = key_of(out)
    f = tmp_path / "old.json"
    mm("tenant", "export", str(f), "--redis", redis.url)
    mm("tenant", "import", str(f), "--store", store, "--redis", redis.url)
    assert tenant_store(store, s3_server).get("legacy")["key_sha256"] == hash_key(key)
    connect_redis(redis.url).flushall()
    assert "indexed 1 tenant(s)" in mm("tenant", "rebuild", "--store", store, "--redis", redis.url)
    assert indexed(redis.url)["legacy"].key_sha256 == hash_key(key)

    # with --store, tenants only Redis has are listed, and a write moves one into the store (or deletes it)
    mm("tenant", "create", "old1", "--redis", redis.url)
    mm("tenant", "create", "old2", "--redis", redis.url)
    assert "old1" in mm("tenant", "list", "--store", store, "--redis", redis.url)
    mm("tenant", "set-limits", "old1", "--tier", "free", "--store", store, "--redis", redis.url)
    assert tenant_store(store, s3_server).get("old1")["limits"] == {"tier": "free"}
    mm("tenant", "delete", "old2", "--store", store, "--redis", redis.url)
    assert sorted(indexed(redis.url)) == ["legacy", "old1"]


def rec(name: str, h: str, tier: str = "standard") -> TenantRecord:
    return TenantRecord(name, h * 64, 1.0, spec={"tier": tier})


def test_next_known_replaces_only_when_redis_says_its_set_is_whole():
    known = {"a": rec("a", "1"), "b": rec("b", "2")}
    assert next_known(known, True, {"a": rec("a", "3")}, None) == {"a": rec("a", "3")}  # deletions, rotations apply
    assert next_known(known, False, {}, None) == known  # flushed, down: keep
    assert next_known(known, False, {"c": rec("c", "4")}, {"a": rec("a", "5", "free")}) == {
        "a": rec("a", "5", "free"), "b": rec("b", "2"), "c": rec("c", "4")}  # only add; the store wins per tenant
    assert next_known({}, False, {}, {"a": rec("a", "1")}) == {"a": rec("a", "1")}  # a fresh router: the store


def test_feed_keeps_the_known_set_when_redis_is_flushed_or_slow(redis, mm, store, s3_server):
    async def main():
        applied: list[dict[str, str]] = []

        def apply(by_hash, limits):
            applied.append(by_hash)

        keys = make_tenants(mm, store, redis.url)
        want = {hash_key(k): n for n, k in keys.items()}
        feed = TenantFeed(RedisTenants(connect_redis(redis.url, timeout_s=0.5), PREFIX), None, timeout_s=0.5)
        await feed.refresh(0.0, apply)
        assert applied[-1] == want and feed.whole
        connect_redis(redis.url).flushall()
        await feed.refresh(1.0, apply)
        assert applied[-1] == want and not feed.whole  # no store: the last known set
        fresh = TenantFeed(RedisTenants(connect_redis(redis.url), PREFIX), tenant_store(store, s3_server),
                           timeout_s=5)
        await fresh.refresh(0.0, apply)
        assert applied[-1] == want  # a router started on an empty Redis reads the store

        mm("tenant", "rebuild", "--store", store, "--redis", redis.url)
        connect_redis(redis.url).execute_command("CLIENT", "PAUSE", "2000", "ALL")  # Redis slow
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            await feed.refresh(2.0, apply)
        assert time.monotonic() - t0 < 1.5 and applied[-1] == want

    asyncio.run(main())


def live(router: RouterProc, key: str) -> grpc.StatusCode:
    try:
        router.stub.ServerLive(pb.ServerLiveRequest(), metadata=auth(key), timeout=5)
        return grpc.StatusCode.OK
    except grpc.RpcError as e:
        return e.code()


def burst(router: RouterProc, keys: list[str], seconds: float) -> dict[grpc.StatusCode, int]:
    codes: dict[grpc.StatusCode, int] = {}
    t0 = time.monotonic()
    i = 0
    while time.monotonic() - t0 < seconds:
        c = live(router, keys[i % len(keys)])
        codes[c] = codes.get(c, 0) + 1
        i += 1
    return codes


def wait_for(router: RouterProc, key: str, code: grpc.StatusCode, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while live(router, key) != code:
        assert time.monotonic() < deadline, f"{key[:8]} never became {code}: {router.log()}"
        time.sleep(0.05)


def test_router_keeps_authenticating_through_flushall_slow_and_down_redis(mm, redis, store, tmp_path, s3_server):
    keys = make_tenants(mm, store, redis.url)
    env = {"MMHOST_S3_ENDPOINT_URL": s3_server.endpoint}
    args = ["--redis", redis.url, "--store", store, "--refresh-interval", "0.1"]
    router = RouterProc(tmp_path, args, env=env)
    late = None
    try:
        for k in keys.values():
            wait_for(router, k, grpc.StatusCode.OK)
        connect_redis(redis.url).flushall()
        codes = burst(router, list(keys.values()), 1.5)  # many refreshes of an empty Redis
        assert codes.get(grpc.StatusCode.UNAUTHENTICATED, 0) == 0 and codes[grpc.StatusCode.OK] > 20, codes

        # a rotation while Redis is empty rebuilds the index from the store: the old key stops promptly
        new_acme = key_of(mm("tenant", "rotate-key", "acme", "--store", store, "--redis", redis.url))
        wait_for(router, keys["acme"], grpc.StatusCode.UNAUTHENTICATED, timeout=5)
        wait_for(router, new_acme, grpc.StatusCode.OK, timeout=5)
        keys["acme"] = new_acme

        connect_redis(redis.url).execute_command("CLIENT", "PAUSE", "2500", "ALL")  # slow Redis
        t0 = time.monotonic()
        codes = burst(router, list(keys.values()), 2.0)
        assert set(codes) == {grpc.StatusCode.OK}, codes
        assert (time.monotonic() - t0) / codes[grpc.StatusCode.OK] < 0.2  # never waits on Redis

        redis.stop()  # Redis down: the last known set, and a router started now reads the store
        codes = burst(router, list(keys.values()), 1.0)
        assert set(codes) == {grpc.StatusCode.OK}, codes
        late = RouterProc(tmp_path, args, env=env)
        for k in keys.values():
            wait_for(late, k, grpc.StatusCode.OK)
        assert live(late, "mmk_" + "x" * 43) == grpc.StatusCode.UNAUTHENTICATED
    finally:
        if late is not None:
            late.stop()
        router.stop()
