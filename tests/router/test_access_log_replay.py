"""The access log replayed: a real router (`--access-log -`, so its JSON lines share one stream with its log
lines, as `kubectl logs` shows them) over the shared cluster's real hostds serves two tenants' models and
refuses some requests (NOT_FOUND, a hostd's INVALID_ARGUMENT, a router's RESOURCE_EXHAUSTED quota shed). The
replay gets the real models with their stored sizes (from the log, and from the store with --sizes-from),
skips and counts the rest, and reports the recorded shed."""

from __future__ import annotations

import json

import grpc
import pytest
from typer.testing import CliRunner

from catalog.index import connect_redis
from catalog.publish import publish_version
from catalog.repository import ModelRepository
from ground.settings import S3Settings
from mmhost.cli import app
from mmhost.demo_models import onnx_manifest
from router.tenants import RedisTenants
from sim.cache_only import run_cache_only
from sim.trace import read_trace_report
from tests.router.conftest import auth, infer_request
from tests.router.router_proc import RouterProc
from storage_adapters import open_storage
from tests.router.test_cluster import code_of, hosts_up, wait_until


@pytest.fixture
def stdout_router(cluster, tmp_path):
    """A router writing its access log to stdout, and a tenant "slow" (one model) allowed one request now and
    then: its second request is shed at the router (quota_rate)."""
    repo = ModelRepository(open_storage(cluster.store, S3Settings(endpoint_url=cluster.env["MMHOST_S3_ENDPOINT_URL"])))
    publish_version(repo, onnx_manifest("slow", "one", "1", cluster.workdir / "globex.onnx", "model.onnx"),
                    {"model.onnx": cluster.workdir / "globex.onnx"})
    reg = RedisTenants(connect_redis(cluster.redis_url), cluster.prefixes["tenants"])
    if "slow" not in cluster.keys:
        cluster.keys["slow"] = reg.create("slow", overrides={"rate": 0.001, "burst": 1})
    env = {**cluster.env, "MMHOST_ROUTER_HOT_QUEUE_DEPTH": "0"}
    r = RouterProc(tmp_path, [*cluster.router_args(), "--access-log", "-"], env)
    wait_until(lambda: hosts_up(r) == len(cluster.alive()), what="router sees every hostd")
    yield r
    r.stop()


def test_a_replayed_access_log_has_the_real_models_sizes_and_shed(cluster, stdout_router, tmp_path):
    r = stdout_router
    acme, globex = auth(cluster.keys["acme"]), auth(cluster.keys["globex"])
    calls = [("acme", "m05", 1, acme)] * 3 + [("acme", "m06", 1, acme)] * 2 + [("globex", "mlp", 1, globex)] * 2
    for _, model, rows, md in calls:
        r.stub.ModelInfer(infer_request(model, rows), metadata=md, timeout=30)
    assert code_of(lambda: r.stub.ModelInfer(infer_request("nope"), metadata=acme, timeout=10))[0] is grpc.StatusCode.NOT_FOUND
    bad = infer_request("m05")
    bad.inputs[0].shape[:] = [1, 3]  # the hostd resolves m05, then refuses the shape
    assert code_of(lambda: r.stub.ModelInfer(bad, metadata=acme, timeout=10))[0] is grpc.StatusCode.INVALID_ARGUMENT
    slow = auth(cluster.keys["slow"])
    r.stub.ModelInfer(infer_request("one"), metadata=slow, timeout=30)
    calls.append(("slow", "one", 1, slow))
    assert code_of(lambda: r.stub.ModelInfer(infer_request("one"), metadata=slow, timeout=10))[0] is \
        grpc.StatusCode.RESOURCE_EXHAUSTED

    def access_lines() -> list[dict]:
        out = []
        for line in r.log_path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                out.append(json.loads(line))  # every JSON line is whole: nothing else is mixed into it
        return out

    def all_written() -> list[dict] | None:
        got = access_lines()
        return got if len(got) == len(calls) + 3 else None

    lines = wait_until(all_written, what="every access line")
    text = r.log_path.read_text()
    assert "router serving on" in text  # log lines in the same stream

    hostd_refusal = next(x for x in lines if x["status"] == "INVALID_ARGUMENT")
    assert hostd_refusal["host"] in [h.addr for h in cluster.hostds] and hostd_refusal["version"] == "1"
    assert hostd_refusal["reason"] == "invalid_argument" and hostd_refusal["size_bytes"] > 0
    shed = next(x for x in lines if x["status"] == "RESOURCE_EXHAUSTED")
    assert (shed["reason"], shed["host"]) == ("quota_rate", "")

    acme_size = (cluster.workdir / "acme.onnx").stat().st_size
    globex_size = (cluster.workdir / "globex.onnx").stat().st_size
    real = {"acme/m05/1": acme_size, "acme/m06/1": acme_size, "globex/mlp/1": globex_size, "slow/one/1": globex_size}
    wl, rep = read_trace_report(r.log_path)
    assert {m.key: m.size for m in wl.models} == real
    assert len(wl) == len(calls) and rep.replayed == len(calls)
    assert rep.non_json >= 1 and rep.sized_default == []
    assert rep.skipped_status == {"NOT_FOUND": 1, "INVALID_ARGUMENT": 1, "RESOURCE_EXHAUSTED": 1}
    assert rep.shed == 1 and rep.shed_reasons == {"quota_rate": 1}
    res = run_cache_only(wl, 2 * acme_size + 2 * globex_size, "lru")
    assert (res.total.requests, res.total.loads, res.total.shed) == (len(calls), 4, 0)

    # the same sizes from the store, and the CLI's report
    out = CliRunner().invoke(app, ["sim", "run", "--trace", str(r.log_path), "--sizes-from", cluster.store,
                                   "-p", "lru", "--cache-bytes", str(acme_size)],
                             env={"MMHOST_S3_ENDPOINT_URL": cluster.env["MMHOST_S3_ENDPOINT_URL"], "COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    assert f"replayed {len(calls)} of" in out.output and "1 NOT_FOUND" in out.output
    assert f"the recorded system shed 1 of {len(calls) + 3} requests" in out.output and "quota_rate 1" in out.output
    assert "no size" not in out.output
