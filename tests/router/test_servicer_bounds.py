"""The router servicer's bounds between tenants, with fake hosts and no processes: ModelInfer bodies charged
to the byte budget (refused past it, given back after the answer, on success and failure alike), a tenant's
`pin` refused before the catalog is asked, other calls' bodies bounded, and an unload without a catalog that
no host knows is NOT_FOUND."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc import aio

from ground.errors import NotFound, PermissionDenied, ResourceExhausted
from ground.inflight_policy import ByteBudget, InflightBytes
from ground.wire import REASON
from protos import grpc_service_pb2 as pb
from router.servicer import MAX_CONTROL_BODY
from tests.router.fakes import C, Call, cluster_of, infer, refusal, status
from tests.router.test_servicer import FakeContext, Rig


def test_infer_bodies_past_the_tenants_byte_budget_are_refused_and_given_back_after_the_answer():
    rig = Rig()
    body = infer("m")
    rig.servicer.inflight = InflightBytes(ByteBudget(total=0, per_tenant=len(body) + 10))
    assert rig.servicer.inflight.acquire("acme", 20).granted  # another request of acme's in flight
    with pytest.raises(ResourceExhausted) as e:
        asyncio.run(rig.servicer.ModelInfer(body, FakeContext()))
    assert e.value.reason == "inflight_bytes" and e.value.retry_after_ms and rig.hosts.calls == []
    rig.servicer.inflight.release("acme", 20)
    asyncio.run(rig.servicer.ModelInfer(body, FakeContext()))
    assert rig.servicer.inflight.total == 0 and len(rig.hosts.calls) == 1


def test_a_failed_forward_gives_its_bytes_back_too():
    rig = Rig(behaviour=lambda call: refusal(C.INVALID_ARGUMENT, "invalid_argument"))
    with pytest.raises(Exception):  # noqa: B017 - the host's refusal, forwarded
        asyncio.run(rig.servicer.ModelInfer(infer("m"), FakeContext()))
    assert rig.servicer.inflight.total == 0


@pytest.mark.parametrize("pin", [True, False])
def test_a_tenants_pin_is_refused_before_anything_is_asked(pin):
    rig = Rig()
    req = pb.RepositoryModelLoadRequest(model_name="m")
    req.parameters["pin"].bool_param = pin
    with pytest.raises(PermissionDenied) as e:
        asyncio.run(rig.servicer.RepositoryModelLoad(req.SerializeToString(), FakeContext()))
    assert e.value.reason == "permission_denied" and rig.hosts.calls == []


def test_bodies_of_other_calls_are_bounded():
    rig = Rig()
    handler = dict(rig.servicer.handler()._method_handlers)  # type: ignore[attr-defined]
    meta = handler["/inference.GRPCInferenceService/ModelMetadata"].unary_unary
    body = pb.ModelMetadataRequest(name="m").SerializeToString() + b"\x1a" + b"\xff\xff\x3f" + b"x" * MAX_CONTROL_BODY

    class Ended(FakeContext):  # the registered handler ends the call with a status (ground/interceptors.py)
        def set_trailing_metadata(self, md) -> None:
            self.trailers = dict(md)

        async def abort(self, code, details):
            self.status = code
            raise aio.AbortError()

    ctx = Ended()
    with pytest.raises(aio.AbortError):
        asyncio.run(meta(body, ctx))
    assert ctx.status == grpc.StatusCode.INVALID_ARGUMENT and ctx.trailers[REASON] == "invalid_argument"
    assert rig.hosts.calls == []


def test_without_a_catalog_an_unload_nobody_knows_is_not_found():
    def host(call: Call):
        return refusal(C.NOT_FOUND, "not_found") if call.address != "h3:1" else b""

    rig = Rig(cluster_of(status("h1:1"), status("h2:1")), behaviour=host)
    body = pb.RepositoryModelUnloadRequest(model_name="ghost").SerializeToString()
    with pytest.raises(NotFound):
        asyncio.run(rig.servicer.RepositoryModelUnload(body, FakeContext(time_remaining=3.0)))
    assert sorted(c.address for c in rig.hosts.calls) == ["h1:1", "h2:1"]  # every host was asked
    rig = Rig(cluster_of(status("h1:1"), status("h3:1")), behaviour=host)
    asyncio.run(rig.servicer.RepositoryModelUnload(body, FakeContext(time_remaining=3.0)))  # h3 knew it


class ReadingContext(FakeContext):
    """A call whose body the handler reads itself (the router's stream-unary ModelInfer)."""

    def __init__(self, body: bytes) -> None:
        super().__init__()
        self.body, self.reads = body, 0

    async def read(self) -> bytes:
        self.reads += 1
        await asyncio.sleep(0)  # bodies of concurrent calls arrive together
        return self.body


def test_a_tenant_whose_budget_is_full_is_refused_before_its_body_is_read():
    rig = Rig()
    rig.servicer.inflight = InflightBytes(ByteBudget(total=0, per_tenant=10_000))  # bodies of 37 bytes
    ctx = ReadingContext(infer("m"))
    asyncio.run(rig.servicer.infer_call(iter(()), ctx))  # room: read, forwarded, everything given back
    burst = [ReadingContext(infer("m")) for _ in range(64)]  # a burst of small requests is never refused

    async def all_at_once() -> None:
        await asyncio.gather(*(rig.servicer.infer_call(iter(()), c) for c in burst))

    asyncio.run(all_at_once())
    assert ctx.reads == 1 and len(rig.hosts.calls) == 65 and rig.servicer.inflight.total == 0
    assert rig.servicer.inflight.acquire("acme", 10_000).granted  # acme's other bodies fill its budget
    ctx = ReadingContext(infer("m"))
    with pytest.raises(ResourceExhausted) as e:
        asyncio.run(rig.servicer.infer_call(iter(()), ctx))
    assert e.value.reason == "inflight_bytes" and ctx.reads == 0 and rig.servicer.inflight.total == 10_000


def test_large_bodies_arriving_at_once_are_bounded_by_the_size_of_the_last_ones():
    rig = Rig()
    body = infer("m")
    rig.servicer.inflight = InflightBytes(ByteBudget(total=0, per_tenant=4 * len(body)))
    rig.servicer.inflight.observe("acme", len(body))
    burst = [ReadingContext(body) for _ in range(10)]

    async def all_at_once() -> list:
        return await asyncio.gather(*(rig.servicer.infer_call(iter(()), c) for c in burst), return_exceptions=True)

    out = asyncio.run(all_at_once())
    refused = [r for r in out if isinstance(r, ResourceExhausted)]
    assert len(refused) == 6 and sum(c.reads for c in burst) == 4  # 4 bodies fit; the rest were never read
