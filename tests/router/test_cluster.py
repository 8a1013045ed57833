"""Redis mode end to end: three hostd processes heartbeating to redis-server, models in S3 (moto_server),
two router processes. Tests run in file order and share the cluster; each says what it relies on."""

from __future__ import annotations

import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from ground.wire import heartbeat_status_key as status_key
from catalog.index import connect_redis
from protos import grpc_service_pb2 as pb
from router.placement_policy import affinity
from router.tenants import RedisTenants
from sim.trace import read_trace_report
from tests.router.conftest import ACME_MODELS, SPARE_MODELS, auth, infer_request
from tests.hostd_proc import metric_value
from tests.router.router_proc import RouterProc

C = grpc.StatusCode


def wait_until(cond, timeout: float = 10.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def routers(cluster, tmp_path_factory):
    work = tmp_path_factory.mktemp("routers")
    env = {**cluster.env, "MMHOST_ROUTER_HOT_QUEUE_DEPTH": "0"}  # copies of hot models have their own test
    with ThreadPoolExecutor(2) as ex:
        rs = list(ex.map(lambda _: RouterProc(work, cluster.router_args(), env), range(2)))
    for r in rs:
        wait_until(lambda r=r: hosts_up(r) == len(cluster.alive()), what="router sees every hostd")
    yield rs
    for r in rs:
        r.stop()


def hosts_up(r: RouterProc) -> int:
    for line in r.metrics_text().splitlines():
        if line.startswith("mmhost_router_hosts_up "):
            return int(float(line.split()[1]))
    return -1


def code_of(fn) -> tuple[grpc.StatusCode, str]:
    try:
        fn()
    except grpc.RpcError as e:
        return e.code(), e.details()
    return C.OK, ""


def test_missing_or_wrong_key_is_unauthenticated(cluster, routers):
    r = routers[0]
    calls = [
        lambda md: r.stub.ModelInfer(infer_request("m00"), metadata=md, timeout=10),
        lambda md: r.stub.RepositoryIndex(pb.RepositoryIndexRequest(), metadata=md, timeout=10),
        lambda md: r.stub.ServerLive(pb.ServerLiveRequest(), metadata=md, timeout=10),
        lambda md: r.stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name="m00"), metadata=md, timeout=10),
    ]
    bad = [(), (("authorization", "Bearer mmk_wrong"),), (("authorization", f"Basic {cluster.keys['acme']}"),),
           (("authorization", f"Bearer {cluster.keys['acme']}x"),)]
    for call in calls:
        for md in bad:
            assert code_of(lambda call=call, md=md: call(md))[0] is C.UNAUTHENTICATED
    assert r.stub.ServerLive(pb.ServerLiveRequest(), metadata=auth(cluster.keys["acme"]), timeout=10).live

    # rotating a key: the old one stops working, the new one works; deleting the tenant stops both
    reg = RedisTenants(connect_redis(cluster.redis_url), cluster.prefixes["tenants"])
    old = reg.create("temp")
    live = lambda key: code_of(lambda: r.stub.ServerLive(pb.ServerLiveRequest(), metadata=auth(key), timeout=5))[0]  # noqa: E731
    wait_until(lambda: live(old) is C.OK, what="new tenant's key accepted")
    new = reg.rotate_key("temp")
    wait_until(lambda: live(old) is C.UNAUTHENTICATED and live(new) is C.OK, what="rotated key")
    reg.delete("temp")
    wait_until(lambda: live(new) is C.UNAUTHENTICATED, what="deleted tenant refused")


def test_a_tenant_cannot_reach_list_or_load_another_tenants_model(cluster, routers):
    r = routers[1]
    acme, globex = auth(cluster.keys["acme"]), auth(cluster.keys["globex"])
    # same name, two tenants: each gets its own model (acme's has 4 outputs, globex's 3)
    out = r.stub.ModelInfer(infer_request("mlp"), metadata=acme, timeout=30)
    assert list(out.outputs[0].shape) == [1, 4]
    out = r.stub.ModelInfer(infer_request("mlp"), metadata=globex, timeout=30)
    assert list(out.outputs[0].shape) == [1, 3]
    # globex's "secret" looks exactly like a model that does not exist
    for name in ("secret", "no_such_model"):
        expect = (C.NOT_FOUND, f"model {name!r} not found")
        for method, req in ((r.stub.ModelInfer, infer_request(name)),
                            (r.stub.ModelMetadata, pb.ModelMetadataRequest(name=name)),
                            (r.stub.ModelConfig, pb.ModelConfigRequest(name=name)),
                            (r.stub.RepositoryModelLoad, pb.RepositoryModelLoadRequest(model_name=name)),
                            (r.stub.ModelStatistics, pb.ModelStatisticsRequest(name=name))):
            assert code_of(lambda method=method, req=req: method(req, metadata=acme, timeout=10)) == expect, method
        assert not r.stub.ModelReady(pb.ModelReadyRequest(name=name), metadata=acme, timeout=10).ready
    listed = {m.name for m in r.stub.RepositoryIndex(pb.RepositoryIndexRequest(), metadata=acme, timeout=10).models}
    assert listed == {*ACME_MODELS, *SPARE_MODELS, "mlp"}
    listed = {m.name for m in r.stub.RepositoryIndex(pb.RepositoryIndexRequest(), metadata=globex, timeout=10).models}
    assert listed == {"mlp", "secret"}
    # acme's calls loaded nothing of globex's (an entry another module's metadata call made stays ABSENT)
    assert all(models.get(("globex", "secret"), "ABSENT") == "ABSENT" for models in cluster.resident().values())
    # globex itself can load and call it
    r.stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name="secret"), metadata=globex, timeout=30)
    assert list(r.stub.ModelInfer(infer_request("secret"), metadata=globex, timeout=30).outputs[0].shape) == [1, 3]


def test_many_models_spread_over_hosts_each_loaded_once_by_two_routers(cluster, routers):
    acme = auth(cluster.keys["acme"])
    # for each model, a burst of first requests through both routers at once
    futures = []
    for m in ACME_MODELS:
        for j in range(6):
            futures.append(routers[j % 2].stub.ModelInfer.future(infer_request(m, request_id=f"{m}-{j}"), metadata=acme, timeout=60))
    for f in futures:
        assert f.result().model_name in ACME_MODELS
    where: dict[str, list[str]] = {m: [] for m in ACME_MODELS}
    for addr, models in cluster.resident().items():
        for (t, m), state in models.items():
            if t == "acme" and m in where:
                assert state == "READY"
                where[m].append(addr)
    assert all(len(hosts) == 1 for hosts in where.values()), where  # one load per model, not one per router
    assert len({hosts[0] for hosts in where.values()}) >= 2  # spread (all 12 on one of 3 hosts: p < 1e-5)
    for r in routers:  # each router's loop-lag watch has sampled the loop that served that burst
        assert metric_value(r.metrics_text(), "mmhost_router_event_loop_lag_seconds_count") > 0


def test_sigkill_of_a_hostd_under_steady_load_fails_no_request(cluster, routers):
    acme = auth(cluster.keys["acme"])
    resident = cluster.resident()
    def acme_models(h):
        return sorted(m for t, m in resident[h.addr] if t == "acme" and m in ACME_MODELS)

    victim = max(cluster.alive(), key=lambda h: len(acme_models(h)))  # 12 models on 3 hosts: it has >= 4
    mine = acme_models(victim)
    shared, only_there = mine[0], mine[1]
    # `shared` gets a second copy on another host, so it is READY elsewhere when the victim dies
    other = next(h for h in cluster.alive() if h is not victim)
    other.stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name=shared), metadata=(("mmhost-tenant", "acme"),), timeout=30)
    wait_until(lambda: ("acme", shared) in cluster.resident()[other.addr], what="second copy")
    time.sleep(0.2)
    time.sleep(0.2)  # two refreshes: both routers see the second copy

    stop = threading.Event()
    results: dict[str, list] = {shared: [], only_there: []}
    errors: list[str] = []

    def load(model: str, router: RouterProc) -> None:
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                router.stub.ModelInfer(infer_request(model), metadata=acme, timeout=30)
                results[model].append((t0, time.monotonic() - t0))
            except grpc.RpcError as e:
                errors.append(f"{model}: {e.code().name} {e.details()}")

    threads = [threading.Thread(target=load, args=(m, r)) for m in (shared, only_there) for r in routers for _ in range(2)]
    for t in threads:
        t.start()
    wait_until(lambda: len(results[shared]) > 20 and len(results[only_there]) > 20, what="steady load")
    killed_at = time.monotonic()
    victim.stop(signal.SIGKILL)
    wait_until(lambda: sum(1 for t0, _ in results[only_there] if t0 > killed_at) > 20
               and sum(1 for t0, _ in results[shared] if t0 > killed_at) > 20, timeout=30, what="load after the kill")
    stop.set()
    for t in threads:
        t.join(30)
    assert errors == []
    # the dead host's heartbeat is gone from Redis within its TTL (1.5 s in these tests)
    r = connect_redis(cluster.redis_url)
    wait_until(lambda: not any(k for k in r.scan_iter(match=cluster.prefixes["hosts"] + "h:*") if k.endswith(f":{victim.port}")),
               timeout=3, what="heartbeat expiry")
    assert ("acme", only_there) in {k for models in cluster.resident().values() for k in models}  # reloaded elsewhere


def test_a_new_hostd_joins_and_takes_load(cluster, routers):
    acme = auth(cluster.keys["acme"])
    new = cluster.start_hostd()
    for r in routers:
        wait_until(lambda r=r: hosts_up(r) == len(cluster.alive()), what="routers see the new hostd")
    addrs = [h.addr for h in cluster.alive()]
    # models that nobody has loaded yet and whose affinity names the new host
    theirs = [m for m in SPARE_MODELS if max(addrs, key=lambda a: affinity(f"acme/{m}", a)) == new.addr]
    assert theirs
    for i, m in enumerate(theirs):
        routers[i % 2].stub.ModelInfer(infer_request(m), metadata=acme, timeout=60)
    assert {m for t, m in cluster.resident()[new.addr] if t == "acme"} == set(theirs)
    # drained with SIGTERM, it leaves Redis at once (not after the TTL) and routers stop using it
    r = connect_redis(cluster.redis_url)
    host_id = new.status().host_id
    assert r.exists(status_key(cluster.prefixes["hosts"], host_id))
    t0 = time.monotonic()
    rc = new.stop(signal.SIGTERM)
    assert rc == 0, f"hostd exited {rc} {time.monotonic() - t0:.1f}s after SIGTERM:\n{new.log()}"
    assert not r.exists(status_key(cluster.prefixes["hosts"], host_id))
    for rt in routers:
        wait_until(lambda rt=rt: hosts_up(rt) == len(cluster.alive()), what="routers drop the drained hostd")
    routers[0].stub.ModelInfer(infer_request(theirs[0]), metadata=acme, timeout=60)  # reloads elsewhere


def test_hot_model_gets_a_second_copy(cluster, tmp_path):
    env = {**cluster.env, "MMHOST_ROUTER_HOT_QUEUE_DEPTH": "2"}
    r = RouterProc(tmp_path, cluster.router_args(), env)
    try:
        acme = auth(cluster.keys["acme"])
        model = "m11"
        holders = lambda: [a for a, ms in cluster.resident().items() if ms.get(("acme", model)) == "READY"]  # noqa: E731
        r.stub.ModelInfer(infer_request(model), metadata=acme, timeout=60)
        before = len(holders())
        assert before == 1
        stop = threading.Event()

        def hammer() -> None:
            while not stop.is_set():
                r.stub.ModelInfer(infer_request(model, rows=16), metadata=acme, timeout=60)

        threads = [threading.Thread(target=hammer) for _ in range(12)]
        for t in threads:
            t.start()
        try:
            wait_until(lambda: len(holders()) > before, timeout=20, what="a second copy of the hot model")
        finally:
            stop.set()
            for t in threads:
                t.join(30)
    finally:
        r.stop()


def test_access_log_lines_are_a_sim_trace(cluster, routers):
    r = routers[0]
    req = infer_request("m03", request_id="trace-me")
    r.stub.ModelInfer(req, metadata=auth(cluster.keys["acme"]), timeout=30)
    code_of(lambda: r.stub.ModelInfer(infer_request("secret"), metadata=auth(cluster.keys["acme"]), timeout=10))
    import json

    def line():
        text = r.access_log.read_text() if r.access_log.exists() else ""
        return next((json.loads(x) for x in text.splitlines() if '"trace-me"' in x), None)

    rec = wait_until(line, what="access log line")
    # lines are written in batches by a thread: wait for the refusal's line too before reading the log as a trace
    wait_until(lambda: '"secret"' in r.access_log.read_text(), what="the NOT_FOUND line")
    assert rec["tenant"] == "acme" and rec["model"] == "m03" and rec["version"] == "1" and rec["status"] == "OK"
    assert rec["host"] in [h.addr for h in cluster.hostds]
    assert rec["size_bytes"] == (cluster.workdir / "acme.onnx").stat().st_size  # the hostd's mmhost-served
    assert rec["reason"] == "" and rec["compute_ms"] > 0 and rec["queue_ms"] >= 0 and rec["load_ms"] >= 0
    assert rec["bytes_in"] == len(req.SerializeToString()) and rec["bytes_out"] > 0 and rec["total_ms"] > 0
    assert abs(rec["ts"] - time.time()) < 60
    wl, rep = read_trace_report(r.access_log)
    assert rep.requested == len(r.access_log.read_text().splitlines()) and rep.non_json == 0
    assert rep.skipped_status["NOT_FOUND"] >= 1  # globex's model, asked for by acme, is no model to replay
    assert "acme/m03/1" in {m.key for m in wl.models} and not any(m.key.startswith("acme/secret") for m in wl.models)


TRITON_SCRIPT = r"""
import json, sys, asyncio
import numpy as np
import tritonclient.grpc as g
import tritonclient.grpc.aio as ga
addr, key = sys.argv[1], sys.argv[2]
h = {"authorization": f"Bearer {key}"}
c = g.InferenceServerClient(addr)
out = {"live": c.is_server_live(headers=h), "ready": c.is_model_ready("mlp", headers=h)}
out["inputs"] = c.get_model_metadata("mlp", headers=h, as_json=True)["inputs"]
x = g.InferInput("input", [2, 8], "FP32"); x.set_data_from_numpy(np.ones((2, 8), np.float32))
out["shape"] = list(c.infer("mlp", [x], headers=h, request_id="t1").as_numpy("output").shape)
out["index"] = sorted(m["name"] for m in c.get_model_repository_index(headers=h, as_json=True)["models"])
try:
    c.infer("secret", [x], headers=h)
except g.InferenceServerException as e:
    out["other_tenant"] = e.status()
async def aio():
    ac = ga.InferenceServerClient(addr)
    rs = await asyncio.gather(*(ac.infer("mlp", [x], headers=h) for _ in range(4)))
    await ac.close()
    return [list(r.as_numpy("output").shape) for r in rs]
out["aio"] = asyncio.run(aio())
print(json.dumps(out))
"""


def test_triton_client_library_through_the_router(cluster, routers):
    import json
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-c", TRITON_SCRIPT, routers[0].addr, cluster.keys["acme"]],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout)
    assert out["live"] and out["ready"]
    assert out["inputs"] == [{"name": "input", "datatype": "FP32", "shape": ["-1", "8"]}]
    assert out["shape"] == [2, 4]
    assert "mlp" in out["index"] and "secret" not in out["index"]
    assert out["other_tenant"] == "StatusCode.NOT_FOUND"  # globex's model, asked for by acme
    assert out["aio"] == [[2, 4]] * 4
