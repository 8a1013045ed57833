"""Embedded mode (no Redis on the router's side): static hosts polled over HostdControl.Status, tenants
from a file written by `mmhost tenant`. Also the `mmhost tenant` CLI against Redis."""

from __future__ import annotations

import json

import grpc
import pytest
from typer.testing import CliRunner

from catalog.index import connect_redis
from mmhost.cli import app
from protos import grpc_service_pb2 as pb
from router.auth import hash_key
from tests.router.conftest import auth, infer_request
from tests.router.router_proc import RouterProc
from tests.router.test_cluster import code_of, wait_until

C = grpc.StatusCode


def tenant_cli(*args: str, env: dict | None = None) -> str:
    res = CliRunner().invoke(app, ["tenant", *args], env=env)
    assert res.exit_code == 0, res.output
    return res.output


def printed_key(output: str) -> str:
    return next(line for line in output.splitlines() if line.startswith("mmk_"))


def test_tenant_cli_with_a_file_prints_the_key_once_and_stores_its_hash(tmp_path):
    f = tmp_path / "tenants.json"
    key = printed_key(tenant_cli("create", "acme", "--tenants", str(f)))
    stored = f.read_text()
    assert key not in stored and json.loads(stored)["tenants"]["acme"]["key_sha256"] == hash_key(key)
    listing = tenant_cli("list", "--tenants", str(f))
    assert "acme" in listing and key not in listing
    res = CliRunner().invoke(app, ["tenant", "create", "acme", "--tenants", str(f)])
    assert res.exit_code == 1 and "already exists" in res.output
    new = printed_key(tenant_cli("rotate-key", "acme", "--tenants", str(f)))
    assert new != key and json.loads(f.read_text())["tenants"]["acme"]["key_sha256"] == hash_key(new)
    tenant_cli("delete", "acme", "--tenants", str(f))
    assert json.loads(f.read_text())["tenants"] == {}


def test_tenant_cli_with_redis_stores_only_hashes(redis_server):
    env = {"MMHOST_ROUTER_TENANTS_PREFIX": "cli-test:tenants:"}
    key = printed_key(tenant_cli("create", "initech", "--redis", redis_server.url, env=env))
    r = connect_redis(redis_server.url)
    dump = {k: r.hgetall(k) for k in r.scan_iter(match="cli-test:tenants:*")}
    assert key not in json.dumps(dump) and hash_key(key) in json.dumps(dump)
    assert "initech" in tenant_cli("list", "--redis", redis_server.url, env=env)


@pytest.fixture(scope="module")
def embedded(cluster, tmp_path_factory):
    work = tmp_path_factory.mktemp("embedded")
    f = work / "tenants.json"
    key = printed_key(tenant_cli("create", "acme", "--tenants", str(f)))
    hosts = ",".join(h.addr for h in cluster.alive())
    env = {"MMHOST_S3_ENDPOINT_URL": cluster.env["MMHOST_S3_ENDPOINT_URL"]}
    r = RouterProc(work, ["--hosts", hosts, "--tenants", str(f), "--store", cluster.store, "--refresh-interval", "0.2"], env)
    yield r, f, key
    r.stop()


def test_embedded_router_serves_from_static_hosts(cluster, embedded):
    r, f, key = embedded
    out = r.stub.ModelInfer(infer_request("m05", request_id="e1"), metadata=auth(key), timeout=60)
    assert out.model_name == "m05" and out.id == "e1" and list(out.outputs[0].shape) == [1, 4]
    assert code_of(lambda: r.stub.ModelInfer(infer_request("secret"), metadata=auth(key), timeout=10))[0] is C.NOT_FOUND
    assert r.stub.ServerReady(pb.ServerReadyRequest(), metadata=auth(key), timeout=10).ready
    # rotating the key in the file: the router picks the change up without a restart
    new = printed_key(tenant_cli("rotate-key", "acme", "--tenants", str(f)))
    live = lambda k: code_of(lambda: r.stub.ServerLive(pb.ServerLiveRequest(), metadata=auth(k), timeout=5))[0]  # noqa: E731
    wait_until(lambda: live(key) is C.UNAUTHENTICATED and live(new) is C.OK, what="rotated key in the file")
