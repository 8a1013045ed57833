"""Random and mutated bodies on every RPC of the v2 service (bench/fuzz.py's generator, seeded), sent as raw
bytes to a hostd directly and through a router: no UNKNOWN, no INTERNAL, every error answered by mmhost
itself (`mmhost-reason`) with a bounded message, both processes alive afterwards and still serving a normal
request. The long version (10,000 bodies per RPC) is `python -m bench.fuzz`."""

from __future__ import annotations

import grpc

from bench.fuzz import RPCS, fuzz
from ground.wire import TENANT_HEADER
from tests.isolation.conftest import FAST_DIMS, auth, fast_request

N = 150  # bodies per RPC per target: about 20 s for both targets on 2 cores


def _fuzz(isolated, target: str):
    proc = isolated.hostd if target == "hostd" else isolated.router
    md = ((TENANT_HEADER, "light"),) if target == "hostd" else auth(isolated.keys["light"])
    tally = fuzz(proc.channel, md, N, seed=7, model="fast", in_dim=FAST_DIMS[0])
    print(target, {rpc: dict(c) for rpc, c in tally.codes.items()})
    assert set(tally.codes) == set(RPCS)
    assert tally.count("UNKNOWN") == 0 and tally.count("INTERNAL") == 0, tally.bad
    assert not tally.bad, tally.bad
    assert isolated.hostd.proc.poll() is None and isolated.router.proc.poll() is None
    # a normal request still succeeds, on the target and through the router
    isolated.router.stub.ModelInfer(fast_request(), metadata=auth(isolated.keys["light"]), timeout=30)
    isolated.hostd.stub.ModelInfer(fast_request(), metadata=((TENANT_HEADER, "light"),), timeout=30)


def test_fuzzed_bodies_on_a_hostd_get_clean_answers(isolated):
    _fuzz(isolated, "hostd")


def test_fuzzed_bodies_through_a_router_get_clean_answers(isolated):
    _fuzz(isolated, "router")


def test_an_undecodable_body_is_invalid_argument_on_both(isolated):
    for proc, md in ((isolated.hostd, ((TENANT_HEADER, "light"),)), (isolated.router, auth(isolated.keys["light"]))):
        for rpc in RPCS:
            if rpc in ("ServerLive", "ServerReady", "ServerMetadata"):
                continue  # empty messages: any bytes that parse at all are a valid request
            try:
                proc.channel.unary_unary(f"/inference.GRPCInferenceService/{rpc}")(b"\x0a\xff\xff\xff\xff\x0f",
                                                                                  metadata=md, timeout=10)
            except grpc.RpcError as e:
                assert e.code() is grpc.StatusCode.INVALID_ARGUMENT, (proc.role, rpc, e.code(), e.details())
            else:
                raise AssertionError(f"{proc.role} {rpc}: an undecodable body was answered OK")


def test_absurd_timeouts_and_priorities_are_no_internal_error(isolated):
    """Found by the long fuzz run: a 500-digit `timeout` overflowed the deadline arithmetic (INTERNAL)."""
    for proc, md in ((isolated.hostd, ((TENANT_HEADER, "light"),)), (isolated.router, auth(isolated.keys["light"]))):
        for key, value in (("timeout", "9" * 500), ("timeout", "9" * 5000), ("priority", "9" * 500),
                           ("timeout", str(2**64 - 1))):
            r = fast_request()
            r.parameters[key].string_param = value
            try:
                proc.stub.ModelInfer(r, metadata=md, timeout=30)
            except grpc.RpcError as e:
                assert e.code() is grpc.StatusCode.INVALID_ARGUMENT, (proc.role, key, e.code(), e.details())
