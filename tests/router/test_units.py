"""Small parts of the router without servers: failover classification, retry budget, key index, the host
view's down/up rules, header parsing."""

from __future__ import annotations

import grpc

from protos import grpc_service_pb2 as pb
from protos import hostd_control_pb2 as hc
from router.auth import KeyIndex, bearer, hash_key, new_key
from router.cluster import ClusterView, HostState
from router.failover import Outcome, RetryBudget, classify
from router.header import read_header

C = grpc.StatusCode


def _md(reason: str, retry_ms: int | None = None) -> tuple[tuple[str, str], ...]:
    md = (("mmhost-reason", reason),)
    return md + ((("retry-after-ms", str(retry_ms)),) if retry_ms is not None else ())


def test_failures_are_classified_by_code_and_reason_never_by_text():
    # no mmhost-reason: the transport failed (refused, reset, torn down), whatever the code says
    assert classify(C.UNAVAILABLE, ()) is Outcome.HOST_DOWN
    assert classify(C.UNKNOWN, ()) is Outcome.HOST_DOWN
    assert classify(C.INTERNAL, ()) is Outcome.HOST_DOWN
    # the host says it is leaving
    assert classify(C.UNAVAILABLE, _md("draining", 50)) is Outcome.HOST_DOWN
    # this host cannot serve this model now: another may
    assert classify(C.UNAVAILABLE, _md("no_capacity", 100)) is Outcome.ELSEWHERE
    # storage is shared by every host: its outage goes back to the caller at once, with its retry-after
    assert classify(C.UNAVAILABLE, _md("storage_down", 100)) is Outcome.FINAL
    # a model's own failure is the model's error: final, and never a host marked down
    assert classify(C.UNAVAILABLE, _md("load_failed", 1000)) is Outcome.FINAL
    assert classify(C.INTERNAL, _md("internal")) is Outcome.FINAL
    for code in (C.INVALID_ARGUMENT, C.NOT_FOUND, C.RESOURCE_EXHAUSTED, C.DEADLINE_EXCEEDED):
        assert classify(code, ()) is Outcome.FINAL
        assert classify(code, _md(code.name.lower())) is Outcome.FINAL


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


def test_router_and_hostd_take_the_tenant_header_from_the_wire_contract():
    import ground.wire
    import hostd.servicer
    import router.servicer

    assert router.servicer.TENANT_HEADER is ground.wire.TENANT_HEADER
    assert hostd.servicer.TENANT_HEADER is ground.wire.TENANT_HEADER


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


def test_hosts_missing_from_the_heartbeat_index_stay_for_the_grace_then_go():
    """A flushed Redis loses every heartbeat at once: the hosts stay eligible until they beat again; a host
    whose heartbeat stays missing past the grace is dropped."""
    v = ClusterView(missing_grace_s=2.0)
    v.apply({"a": _status("a", 1.0), "b": _status("b", 1.0)}, complete=True, now=10.0)
    v.apply({}, complete=True, now=10.1)  # FLUSHALL
    assert {h.address for h in v.eligible()} == {"a", "b"}
    v.apply({"a": _status("a", 1.2)}, complete=True, now=10.3)  # a beat again; b not yet
    assert {h.address for h in v.eligible()} == {"a", "b"}
    v.apply({"a": _status("a", 1.4), "b": _status("b", 1.4)}, complete=True, now=11.0)  # b is back: its clock resets
    v.apply({"a": _status("a", 1.6)}, complete=True, now=11.5)
    v.apply({"a": _status("a", 1.8)}, complete=True, now=13.4)
    assert "b" in v.hosts
    v.apply({"a": _status("a", 2.0)}, complete=True, now=13.5)  # missing for 2 s: gone
    assert set(v.hosts) == {"a"}


def test_header_reads_only_the_routing_fields():
    req = pb.ModelInferRequest(model_name="m", model_version="2", id="r", raw_input_contents=[b"x" * 1000])
    req.parameters["priority"].int64_param = 1
    h = read_header(req.SerializeToString())
    assert (h.model_name, h.model_version, h.id, h.parameters["priority"].int64_param) == ("m", "2", "r", 1)
    assert h.ByteSize() < 100  # the tensor payload is not kept (tests/router/test_header.py has more)


def test_a_static_host_is_down_only_after_polls_fail_in_a_row():
    """Embedded mode: one missed Status poll (a hostd busy receiving large bodies) keeps the last status;
    `down_after` failures in a row make the host down; an answer resets the count."""
    import asyncio

    from router.cluster import StaticHosts

    class Poll:
        fail = False
        sent = 0.0

        async def status(self, addr: str, timeout: float) -> hc.HostStatus:
            if self.fail:
                raise TimeoutError("slow")
            self.sent += 1.0  # a hostd stamps each status it sends
            return _status("x", self.sent)

    poll = Poll()
    src = StaticHosts(poll, ["a"], 1.0, down_after=3)
    v = ClusterView()

    def refresh() -> None:
        v.apply(asyncio.run(src.read()), src.complete)

    refresh()
    assert [h.address for h in v.eligible()] == ["a"]
    poll.fail = True
    refresh()
    refresh()
    assert [h.address for h in v.eligible()] == ["a"]  # two misses: still up
    refresh()
    assert v.eligible() == [] and v.hosts["a"].state is HostState.DOWN
    poll.fail = False
    refresh()
    assert [h.address for h in v.eligible()] == ["a"]
