"""Host groups end to end: a shared hostd and a "bulk" hostd (HostdSettings.host_group) heartbeating to
redis-server under a prefix of their own, models in S3 (moto_server), and a router whose host_groups send
one tenant, and one model of another, to the bulk host. What users rely on: a model mapped to a group is
loaded and answered only by that group's hosts, everything else only by the shared pool, and a group with
no host up refuses its models with UNAVAILABLE while the shared pool keeps serving."""

from __future__ import annotations

import json
import uuid
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from tests.hostd_proc import HostdProc
from tests.router.conftest import auth, infer_request
from tests.router.router_proc import RouterProc
from tests.router.test_cluster import code_of, hosts_up, wait_until

C = grpc.StatusCode


@pytest.fixture(scope="module")
def grouped(cluster, tmp_path_factory):
    work = tmp_path_factory.mktemp("host-groups")
    prefix = f"g{uuid.uuid4().hex[:8]}:hosts:"
    env = {**cluster.env, "MMHOST_HOSTD_HEARTBEAT_PREFIX": prefix, "MMHOST_ROUTER_HEARTBEAT_PREFIX": prefix}
    groups = {"": {}, "bulk": {"MMHOST_HOSTD_HOST_GROUP": "bulk"}}
    with ThreadPoolExecutor(2) as ex:
        shared, bulk = ex.map(lambda g: HostdProc(cluster.store, work, env={**env, **groups[g]},
                                                  args=["--redis", cluster.redis_url], tenant="nobody"), groups)
    router_env = {**env, "MMHOST_ROUTER_HOT_QUEUE_DEPTH": "0",
                  "MMHOST_ROUTER_HOST_GROUPS": json.dumps({"globex": "bulk", "acme/m03": "bulk"})}
    r = RouterProc(work, cluster.router_args(), router_env)
    wait_until(lambda: hosts_up(r) == 2, what="the router sees both hostds")
    yield r, shared, bulk
    r.stop()
    for h in (shared, bulk):
        h.stop()


def group_hosts_up(r: RouterProc) -> dict[str, int]:
    out = {}
    for line in r.metrics_text().splitlines():
        if line.startswith("mmhost_router_host_group_hosts_up{"):
            out[line.split('group="', 1)[1].split('"', 1)[0]] = int(float(line.rsplit(" ", 1)[1]))
    return out


def resident(h: HostdProc) -> set[tuple[str, str]]:
    return {(m.tenant, m.model) for m in h.status().models if m.state == "READY"}


def test_hostd_reports_its_group(grouped):
    _, shared, bulk = grouped
    assert shared.status().host_group == "" and bulk.status().host_group == "bulk"


def test_models_load_and_are_answered_only_in_their_group(cluster, grouped):
    r, shared, bulk = grouped
    acme, globex = auth(cluster.keys["acme"]), auth(cluster.keys["globex"])
    for _ in range(3):  # several calls each: every one goes to the group's host, none to the other
        assert r.stub.ModelInfer(infer_request("m00"), metadata=acme, timeout=60).model_name == "m00"
        assert r.stub.ModelInfer(infer_request("m03"), metadata=acme, timeout=60).model_name == "m03"
        out = r.stub.ModelInfer(infer_request("mlp"), metadata=globex, timeout=60)
        assert list(out.outputs[0].shape) == [1, 3]  # globex's own mlp, not acme's
    assert resident(shared) == {("acme", "m00")}
    assert resident(bulk) == {("acme", "m03"), ("globex", "mlp")}
    # the access log is written off the request path, in batches: wait for the nine lines
    wait_until(lambda: r.access_log.exists() and len(r.access_log.read_text().splitlines()) >= 9,
               what="the access log lines")
    served: dict[tuple[str, str], set[str]] = {}
    for line in r.access_log.read_text().splitlines():
        rec = json.loads(line)
        served.setdefault((rec["tenant"], rec["model"]), set()).add(rec["host"])
    assert served[("acme", "m00")] == {shared.addr}
    assert served[("acme", "m03")] == {bulk.addr} and served[("globex", "mlp")] == {bulk.addr}


def test_a_group_with_no_host_up_is_refused_and_the_shared_pool_serves_on(cluster, grouped):
    r, shared, bulk = grouped
    acme, globex = auth(cluster.keys["acme"]), auth(cluster.keys["globex"])
    assert group_hosts_up(r) == {"": 1, "bulk": 1}
    bulk.stop()
    wait_until(lambda: hosts_up(r) == 1, timeout=15, what="the router sees the bulk hostd gone")
    assert group_hosts_up(r) == {"": 1, "bulk": 0}  # what an operator sees of it (mmhost_router_host_group_hosts_up)
    code, details = code_of(lambda: r.stub.ModelInfer(infer_request("mlp"), metadata=globex, timeout=10))
    assert code is C.UNAVAILABLE and "no host" in details
    assert code_of(lambda: r.stub.ModelInfer(infer_request("m03"), metadata=acme, timeout=10))[0] is C.UNAVAILABLE
    assert r.stub.ModelInfer(infer_request("m00"), metadata=acme, timeout=30).model_name == "m00"
    assert ("globex", "mlp") not in resident(shared)  # not loaded in the shared pool to answer
