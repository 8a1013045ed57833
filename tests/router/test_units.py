"""Small parts of the router without servers: failover classification, retry budget, key index, the host
view's down/up rules, header parsing."""

from __future__ import annotations

import grpc

from protos import grpc_service_pb2 as pb
from protos import hostd_control_pb2 as hc
from protos.router_header_pb2 import InferHeader
from router.auth import KeyIndex, bearer, hash_key, new_key
from router.cluster import ClusterView, HostState
from router.failover import Outcome, RetryBudget, classify

C = grpc.StatusCode


def test_failures_are_classified():
    assert classify(C.UNAVAILABLE, "failed to connect to all addresses", ()) is Outcome.HOST_DOWN
    assert classify(C.UNAVAILABLE, "no capacity", (("retry-after-ms", "100"),)) is Outcome.ELSEWHERE
    assert classify(C.UNAVAILABLE, "server is draining; retry on another host", (("retry-after-ms", "50"),)) is Outcome.HOST_DOWN
    for code in (C.INVALID_ARGUMENT, C.NOT_FOUND, C.RESOURCE_EXHAUSTED, C.DEADLINE_EXCEEDED):
        assert classify(code, "", ()) is Outcome.FINAL


def test_retry_budget_is_earned_by_requests():
    b = RetryBudget(ratio=0.5, cap=2)
    assert b.withdraw() and b.withdraw() and not b.withdraw()
    b.deposit()
    assert not b.withdraw()
    b.deposit()
    assert b.withdraw()


def test_key_index_maps_only_exact_keys():
    k = new_key()
    idx = KeyIndex({hash_key(k): "acme"})
    assert idx.tenant(k) == "acme"
    assert idx.tenant(k + "x") is None and idx.tenant(None) is None and idx.tenant("") is None
    assert bearer((("authorization", f"Bearer {k}"),)) == k
    assert bearer((("authorization", f"Basic {k}"),)) is None


def test_tenant_header_is_hostds():
    from hostd.servicer import TENANT_HEADER as HOSTD
    from router.servicer import TENANT_HEADER

    assert TENANT_HEADER == HOSTD


def _status(addr: str, sent: float, *models: tuple[str, str, str]) -> hc.HostStatus:
    return hc.HostStatus(host_id=addr, address=addr, sent_unix=sent, device_memory_total=1 << 30,
                         models=[hc.ModelStatus(tenant=t, model=m, version="1", state=s) for t, m, s in models])


def test_a_failed_host_stays_down_until_a_newer_status_arrives():
    v = ClusterView()
    v.apply({"a": _status("a", 1.0, ("t", "m", "READY")), "b": _status("b", 1.0)}, complete=True)
    assert {h.address for h in v.eligible()} == {"a", "b"}
    assert "t/m" in v.eligible()[0].models and "t/m/1" in v.eligible()[0].models
    assert v.mark_down("a") and not v.mark_down("a")
    v.apply({"a": _status("a", 1.0, ("t", "m", "READY")), "b": _status("b", 1.2)}, complete=True)  # stale beat
    assert [h.address for h in v.eligible()] == ["b"] and v.hosts["a"].state is HostState.DOWN
    v.apply({"a": _status("a", 1.4), "b": _status("b", 1.4)}, complete=True)
    assert v.hosts["a"].state is HostState.UP
    v.apply({"b": _status("b", 1.6)}, complete=True)  # a's heartbeat expired
    assert "a" not in v.hosts


def test_header_reads_only_the_routing_fields():
    req = pb.ModelInferRequest(model_name="m", model_version="2", id="r", raw_input_contents=[b"x" * 1000])
    req.parameters["priority"].int64_param = 1
    h = InferHeader.FromString(req.SerializeToString())
    assert (h.model_name, h.model_version, h.id, h.parameters["priority"].int64_param) == ("m", "2", "r", 1)
