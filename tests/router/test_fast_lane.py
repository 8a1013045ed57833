"""The router's fast lane on real processes: a router with fast_lane=haproxy (HAProxy in front, started by the
router) over two hostds in embedded mode. An unlimited tenant's calls to a READY model go straight from
HAProxy to a hostd and come back with the model's answer, counted and logged by the router as its own;
everything else (a wrong key, another tenant's model, a limited tenant, a body larger than HAProxy's buffer)
is answered by the Python router exactly as without the fast lane; a host killed under the fast lane's
traffic is skipped without an error."""

from __future__ import annotations

import json
import signal
import time

import grpc
import numpy as np
import pytest

from catalog.publish import publish_version
from catalog.repository import ModelRepository
from mmhost.demo_models import build_onnx_mlp, onnx_manifest
from protos import grpc_service_pb2 as pb
from router.tenants import FileTenants
from storage_adapters.local import LocalStorage
from tests.hostd_proc import HostdProc, metric_value
from tests.router.conftest import IN_DIM, auth, infer_request
from tests.router.router_proc import RouterProc
from tests.router.test_cluster import code_of, wait_until

C = grpc.StatusCode
WIDE = 20000  # a request of this model's is 80 KB: more than HAProxy's 64 KiB buffer


@pytest.fixture(scope="module")
def lane(tmp_path_factory):
    """A local store with models for tenants fast (unlimited), capped (one request now and then) and other."""
    work = tmp_path_factory.mktemp("fast-lane")
    build_onnx_mlp(work / "m.onnx", (IN_DIM, 16, 4))
    repo = ModelRepository(LocalStorage(work / "store"))
    build_onnx_mlp(work / "wide.onnx", (WIDE, 4, 2))
    for tenant, model, f in (("fast", "m", "m"), ("fast", "m2", "m"), ("capped", "m", "m"), ("other", "secret", "m"),
                             ("fast", "wide", "wide"), ("mover", "m", "m")):
        publish_version(repo, onnx_manifest(tenant, model, "1", work / f"{f}.onnx", "model.onnx"),
                        {"model.onnx": work / f"{f}.onnx"})
    tenants = FileTenants(work / "tenants.json")
    keys = {"fast": tenants.create("fast"), "other": tenants.create("other"), "mover": tenants.create("mover"),
            "capped": tenants.create("capped", overrides={"rate": 0.001, "burst": 1})}
    return work, keys


def start(work, n_hosts: int = 2):
    hosts = [HostdProc(str(work / "store"), work, tenant="nobody") for _ in range(n_hosts)]
    router = RouterProc(work, ["--hosts", ",".join(h.addr for h in hosts), "--tenants", str(work / "tenants.json"),
                               "--store", str(work / "store"), "--refresh-interval", "0.2", "--fast-lane", "haproxy"])
    return router, hosts


@pytest.fixture(scope="module")
def cluster(lane):
    work, keys = lane
    router, hosts = start(work)
    yield router, hosts, keys
    router.stop()
    for h in hosts:
        h.stop()


def syncs(r: RouterProc) -> float:
    return metric_value(r.metrics_text(), "mmhost_router_fast_lane_syncs_total")


def after_syncs(r: RouterProc, n: int = 2) -> None:
    """Wait until the router has given HAProxy its state `n` more times (what it decides is in HAProxy now)."""
    start = syncs(r)
    wait_until(lambda: syncs(r) >= start + n, what=f"{n} fast-lane syncs")


def fast_count(r: RouterProc) -> float:
    return metric_value(r.metrics_text(), "mmhost_router_fast_lane_requests_total")


def routes(r: RouterProc) -> float:
    return metric_value(r.metrics_text(), "mmhost_router_fast_lane_routes")


def access(r: RouterProc) -> list[dict]:
    if not r.access_log.exists():
        return []
    return [json.loads(x) for x in r.access_log.read_text().splitlines() if x.strip()]


def warm(r: RouterProc, md, model: str = "m") -> None:
    """Call until a call takes the fast lane: the first loads the model (Python lane); the router routes it once
    its view shows it READY."""
    def routed() -> bool:
        n = fast_count(r)
        r.stub.ModelInfer(infer_request(model), metadata=md, timeout=30)
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            if fast_count(r) > n:
                return True
            time.sleep(0.05)
        return False

    wait_until(routed, timeout=20, what=f"{model} on the fast lane")


def test_ready_models_of_unlimited_tenants_take_the_fast_lane(cluster):
    r, hosts, keys = cluster
    md = auth(keys["fast"])
    warm(r, md)
    before, lines_before = fast_count(r), len(access(r))
    req = infer_request("m", rows=3, request_id="call-7")
    want = hosts[0].stub.ModelInfer(req, metadata=(("mmhost-tenant", "fast"),), timeout=30)
    for _ in range(20):
        resp, call = r.stub.ModelInfer.with_call(req, metadata=md, timeout=30)
        assert resp.raw_output_contents == want.raw_output_contents  # the model's own answer
        assert resp.outputs[0].shape == [3, 4]
        assert not [k for k, _ in call.trailing_metadata() or () if k.startswith("mmhost-served")]  # nothing internal
    wait_until(lambda: fast_count(r) - before >= 20, what="20 fast-lane requests counted")
    assert fast_count(r) - before == 20
    lines = wait_until(lambda: (x := access(r)[lines_before:]) and len(x) >= 20 and x, what="20 access log lines")
    for line in lines[-20:]:
        assert line["tenant"] == "fast" and line["model"] == "m" and line["status"] == "OK"
        assert line["host"] in [h.addr for h in hosts] and line["version"] == "1"
        assert line["size_bytes"] and line["size_bytes"] > 0 and line["id"] == "call-7"
        assert line["total_ms"] >= 0 and line["bytes_in"] > 0
    text = r.metrics_text()
    assert metric_value(text, "mmhost_router_requests_total", tenant="fast", model="m", status="OK") >= 21
    assert metric_value(text, "mmhost_router_fast_lane_up") == 1


def test_every_call_of_a_concurrent_burst_is_counted(cluster):
    """The log reader wakes every few milliseconds under load and reads all the lines that queued meanwhile
    (router/fastlane.py _read_logs): none of a burst's lines is lost or counted twice."""
    from concurrent.futures import ThreadPoolExecutor

    r, _, keys = cluster
    md = auth(keys["fast"])
    warm(r, md)
    before = fast_count(r)
    req = infer_request("m", rows=1)
    with ThreadPoolExecutor(16) as ex:
        list(ex.map(lambda _: r.stub.ModelInfer(req, metadata=md, timeout=30), range(400)))
    wait_until(lambda: fast_count(r) - before >= 400, what="400 fast-lane requests counted")
    assert fast_count(r) - before == 400  # a line read twice would be in the same hand-over


def test_everything_else_is_answered_by_the_python_router(cluster):
    r, hosts, keys = cluster
    md, other = auth(keys["fast"]), auth(keys["other"])
    warm(r, md)
    warm(r, other, "secret")
    before = fast_count(r)
    assert code_of(lambda: r.stub.ModelInfer(infer_request("m"), metadata=auth("mmk_" + "x" * 43), timeout=10))[0] \
        is C.UNAUTHENTICATED
    assert code_of(lambda: r.stub.ModelInfer(infer_request("m"), metadata=(("authorization", "Basic eA=="),),
                                             timeout=10))[0] is C.UNAUTHENTICATED
    # another tenant's READY model is indistinguishable from a missing one
    theirs = code_of(lambda: r.stub.ModelInfer(infer_request("secret"), metadata=md, timeout=10))
    missing = code_of(lambda: r.stub.ModelInfer(infer_request("secre7"), metadata=md, timeout=10))
    assert theirs[0] is missing[0] is C.NOT_FOUND and theirs[1].replace("secret", "secre7") == missing[1]
    # a body larger than HAProxy's buffer (64 KiB) is served by the Python lane
    big = pb.ModelInferRequest(model_name="wide", inputs=[pb.ModelInferRequest.InferInputTensor(
        name="input", datatype="FP32", shape=[1, WIDE])], raw_input_contents=[np.ones((1, WIDE), np.float32).tobytes()])
    assert len(big.SerializeToString()) > 65536
    for _ in range(3):  # loaded by the first, READY for the others: still not for the fast lane
        assert r.stub.ModelInfer(big, metadata=md, timeout=30).outputs[0].shape == [1, 2]
        after_syncs(r, 1)  # the model READY in the router's view by the later calls
    assert fast_count(r) == before  # none of these went the fast way
    # a hostd's refusal on the fast lane reaches the caller as it is, and the router logs it with its reason
    bad = infer_request("m")
    bad.inputs[0].shape[:] = [1, 3]
    code, msg = code_of(lambda: r.stub.ModelInfer(bad, metadata=md, timeout=10))
    assert code is C.INVALID_ARGUMENT and "shape" in msg
    wait_until(lambda: fast_count(r) == before + 1, what="the refusal counted on the fast lane")
    line = wait_until(lambda: [x for x in access(r) if x["status"] == "INVALID_ARGUMENT"], what="its access line")[-1]
    assert line["reason"] == "invalid_argument" and line["version"] == "1" and line["host"] in [h.addr for h in hosts]


def test_a_tenant_with_limits_is_admitted_by_the_python_router(cluster):
    r, hosts, keys = cluster
    md = auth(keys["capped"])
    before = fast_count(r)
    r.stub.ModelInfer(infer_request("m"), metadata=md, timeout=30)
    wait_until(lambda: ("capped", "m", "READY") in {(m.tenant, m.model, m.state) for h in hosts for m in h.status().models},
               what="capped's model READY")
    after_syncs(r, 3)  # hosts refreshed, then synced: a fast route for capped would be there by now
    code, _ = code_of(lambda: r.stub.ModelInfer(infer_request("m"), metadata=md, timeout=10))
    assert code is C.RESOURCE_EXHAUSTED  # its rate limit holds: the fast lane never serves it
    assert fast_count(r) == before


def test_limits_set_live_take_a_tenant_off_the_fast_lane(cluster, lane):
    r, _, keys = cluster
    md = auth(keys["mover"])
    warm(r, md)  # unlimited: on the fast lane
    FileTenants(lane[0] / "tenants.json").set_limits("mover", overrides={"rate": 0.001, "burst": 1})
    after_syncs(r, 3)  # the tenants refresh (0.2 s) reads the file again, a sync after it gives HAProxy the keys
    before = fast_count(r)
    codes = [code_of(lambda: r.stub.ModelInfer(infer_request("m"), metadata=md, timeout=10))[0] for _ in range(3)]
    assert codes[1:] == [C.RESOURCE_EXHAUSTED] * 2  # its new limit holds at once
    after_syncs(r, 1)  # a log line of a fast call would have been read by now (every 50 ms)
    assert fast_count(r) == before


def test_a_host_killed_under_fast_lane_traffic_is_skipped(lane, tmp_path):
    work, keys = lane
    r, hosts = start(work)
    try:
        md = auth(keys["fast"])
        for h in hosts:  # the model READY on both
            h.stub.ModelInfer(infer_request("m2"), metadata=(("mmhost-tenant", "fast"),), timeout=30)
        wait_until(lambda: routes(r) >= 2, what="routes to m2")
        before = fast_count(r)
        r.stub.ModelInfer(infer_request("m2"), metadata=md, timeout=30)
        wait_until(lambda: fast_count(r) > before, what="a fast-lane call")
        served_by = wait_until(lambda: [x for x in access(r) if x["model"] == "m2"], what="its access line")[-1]["host"]
        victim = next(h for h in hosts if h.addr == served_by)
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait(10)
        errors = []
        for _ in range(40):
            code, msg = code_of(lambda: r.stub.ModelInfer(infer_request("m2"), metadata=md, timeout=10))
            if code is not C.OK:
                errors.append((code, msg))
            time.sleep(0.02)
        assert errors == []
        survivor = next(h for h in hosts if h is not victim)
        wait_until(lambda: [y for y in access(r) if y["model"] == "m2"][-1]["host"] == survivor.addr,
                   what="the survivor serving")
    finally:
        r.stop()
        for h in hosts:
            h.stop()


def test_haproxy_killed_is_started_again_and_serves(lane):
    work, keys = lane
    r, hosts = start(work, n_hosts=1)
    try:
        md = auth(keys["fast"])
        warm(r, md)
        import psutil

        child = psutil.Process(r.proc.pid).children()[0]
        assert "haproxy" in child.name()
        child.kill()
        child.wait(10)
        # the router starts it again at its next refresh (the port refuses meanwhile) and sends it its state
        # whole: fast again
        wait_until(lambda: code_of(lambda: r.stub.ModelInfer(infer_request("m"), metadata=md, timeout=5))[0] is C.OK,
                   what="the port answering again")
        warm(r, md)
        assert metric_value(r.metrics_text(), "mmhost_router_fast_lane_restarts_total") == 1
        assert metric_value(r.metrics_text(), "mmhost_router_fast_lane_up") == 1
    finally:
        r.stop()
        for h in hosts:
            h.stop()


def test_the_fast_lane_sends_a_grouped_model_only_to_its_groups_host(lane):
    """Host groups (router/host_groups.py) on HAProxy's routes: fast/m2 mapped to group bulk is READY on both
    hosts (loaded on each directly), and every fast-lane call for it goes to the bulk host; fast/m, in the
    shared pool, never does."""
    work, keys = lane
    shared = HostdProc(str(work / "store"), work, tenant="nobody")
    bulk = HostdProc(str(work / "store"), work, tenant="nobody", env={"MMHOST_HOSTD_HOST_GROUP": "bulk"})
    r = RouterProc(work, ["--hosts", f"{shared.addr},{bulk.addr}", "--tenants", str(work / "tenants.json"),
                          "--store", str(work / "store"), "--refresh-interval", "0.2", "--fast-lane", "haproxy"],
                   {"MMHOST_ROUTER_HOST_GROUPS": json.dumps({"fast/m2": "bulk"})})
    try:
        md = auth(keys["fast"])
        for h in (shared, bulk):  # both READY on both hosts: only the groups tell the holders apart
            for model in ("m", "m2"):
                h.stub.ModelInfer(infer_request(model), metadata=(("mmhost-tenant", "fast"),), timeout=30)
        warm(r, md, "m2")
        warm(r, md, "m")
        before, lines_before = fast_count(r), len(access(r))
        for _ in range(15):
            for model in ("m", "m2"):
                r.stub.ModelInfer(infer_request(model), metadata=md, timeout=30)
        wait_until(lambda: fast_count(r) - before >= 30, what="30 fast-lane requests")
        lines = wait_until(lambda: (x := access(r)[lines_before:]) and len(x) >= 30 and x, what="30 access log lines")
        hosts_of = {m: {x["host"] for x in lines if x["model"] == m} for m in ("m", "m2")}
        assert hosts_of == {"m2": {bulk.addr}, "m": {shared.addr}}
    finally:
        r.stop()
        for h in (shared, bulk):
            h.stop()
