"""hostd takes tenant limits from the tenant registry: the routers' tenants file in embedded mode, the Redis
registry in cluster mode, and picks up `mmhost tenant set-limits` without a restart (instance counts apply
to the next load). `mmhost top --once` shows the cluster from polled hosts and from Redis heartbeats."""

from __future__ import annotations

import time
import uuid

from typer.testing import CliRunner

from catalog.index import connect_redis
from mmhost.cli import app
from protos import grpc_service_pb2 as pb
from router.tenants import RedisTenants
from tests.hostd_proc import HostdProc
from tests.isolation.conftest import build_store, slow_request

from ground.wire import TENANT_HEADER


def cli(*args: str, env: dict | None = None) -> str:
    res = CliRunner().invoke(app, list(args), env=env)
    assert res.exit_code == 0, res.output
    return res.output


def instances_after_reload(h: HostdProc, tenant: str, model: str = "slow") -> int:
    md = ((TENANT_HEADER, tenant),)
    try:
        h.stub.RepositoryModelUnload(pb.RepositoryModelUnloadRequest(model_name=model), metadata=md, timeout=30)
    except Exception:  # noqa: BLE001 - not loaded yet
        pass
    h.stub.ModelInfer(slow_request(rows=1), metadata=md, timeout=60)
    return next(m.instances for m in h.status().models if m.tenant == tenant and m.model == model and m.state == "READY")


def wait_instances(h: HostdProc, tenant: str, want: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    got = None
    while time.monotonic() < deadline:
        got = instances_after_reload(h, tenant)
        if got == want:
            return
        time.sleep(0.1)
    raise AssertionError(f"{tenant}: {got} instances, expected {want}")


def test_hostd_takes_instances_from_the_routers_tenants_file_and_follows_set_limits(isolated):
    h, f = isolated.hostd, str(isolated.tenants_file)
    isolated.router.stub.ModelInfer(slow_request(rows=1), metadata=(("authorization", f"Bearer {isolated.keys['big']}"),),
                                    timeout=60)
    by = {(m.tenant, m.model): m.instances for m in h.status().models if m.state == "READY"}
    assert by[("big", "slow")] == 2  # premium tier: 2 instances per model
    assert instances_after_reload(h, "noisy") == 1  # free tier: 1
    cli("tenant", "set-limits", "big", "--instances", "3", "--tenants", f)
    wait_instances(h, "big", 3)
    assert "tier premium" in cli("tenant", "list", "--tenants", f)


def test_top_once_shows_polled_hosts_models_and_sheds(isolated):
    out = cli("top", "--once", "--hosts", f"{isolated.hostd.addr},127.0.0.1:1")
    assert isolated.hostd.addr in out and "127.0.0.1:1" in out and "DOWN" in out
    assert "slow" in out and "big" in out and "hit rate" in out and "shed" in out


def test_hostd_in_redis_mode_follows_the_redis_registry_and_top_reads_heartbeats(redis_server, tmp_path):
    store = tmp_path / "store"
    build_store(store, tmp_path)
    tag = uuid.uuid4().hex[:8]
    env = {"MMHOST_HOSTD_TENANTS_PREFIX": f"r{tag}:tenants:", "MMHOST_HOSTD_TENANTS_REFRESH_S": "0.2",
           "MMHOST_HOSTD_HEARTBEAT_PREFIX": f"r{tag}:hosts:", "MMHOST_HOSTD_HEARTBEAT_INTERVAL_S": "0.2"}
    reg = RedisTenants(connect_redis(redis_server.url), f"r{tag}:tenants:")
    reg.create("big", "premium", {"instances": 3})
    h = HostdProc(str(store), tmp_path, args=["--redis", redis_server.url], env=env, tenant="nobody")
    try:
        assert instances_after_reload(h, "big") == 3  # read before the host served
        reg.set_limits("big", overrides={"instances": 1})
        wait_instances(h, "big", 1)  # picked up live
        out = cli("top", "--once", "--redis", redis_server.url, "--heartbeat-prefix", f"r{tag}:hosts:")
        assert h.addr in out and "slow" in out and "UP" in out
    finally:
        h.stop()
