"""Fakes for the router's unit tests (Ray Serve's FakeRunningReplica style): a clock the test moves, and
hosts that answer as a test scripts them, behind the dispatcher's HostClient protocol. No processes, no gRPC
server, no sleeping."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from ground.wire import REASON, RETRY_AFTER, TENANT_HEADER
from protos import grpc_service_pb2 as pb
from protos import hostd_control_pb2 as hc
from router.cluster import ClusterView
from router.host_client import HostError

C = grpc.StatusCode


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass(frozen=True)
class Call:
    address: str
    method: str
    body: bytes
    timeout: float | None
    tenant: str

    @property
    def model(self) -> str:
        if self.method == "ModelInfer":
            return pb.ModelInferRequest.FromString(self.body).model_name
        if self.method == "RepositoryModelLoad":
            return pb.RepositoryModelLoadRequest.FromString(self.body).model_name
        return ""


def transport_error() -> HostError:
    """What a killed host gives: no mmhost process answered, so no mmhost-reason."""
    return HostError(C.UNAVAILABLE, "failed to connect to all addresses; connection refused")


def refusal(code: grpc.StatusCode, reason: str, retry_ms: int | None = None) -> HostError:
    """What a hostd answers: a status with the mmhost-reason trailer."""
    md: tuple[tuple[str, str], ...] = ((REASON, reason),)
    if retry_ms is not None:
        md += ((RETRY_AFTER, str(retry_ms)),)
    return HostError(code, f"refused: {reason}", md)


Behaviour = Callable[[Call], "bytes | HostError"]


def ok(call: Call) -> bytes:
    """A hostd that answers every inference: the response names the model, the version "1" and the id."""
    if call.method == "ModelInfer":
        req = pb.ModelInferRequest.FromString(call.body)
        return pb.ModelInferResponse(model_name=req.model_name, model_version="1", id=req.id).SerializeToString()
    return b""


@dataclass
class FakeHosts:
    """Every host answers with `behaviour` unless the test scripts otherwise: `down` hosts fail as a killed
    host does; `script` answers are used up one per call, whatever host the call went to; each call takes
    `latency` seconds of the fake clock."""

    clock: FakeClock
    behaviour: Behaviour = ok
    down: set[str] = field(default_factory=set)
    script: list[HostError | bytes] = field(default_factory=list)
    latency: float = 0.0
    calls: list[Call] = field(default_factory=list)
    trailing: tuple[tuple[str, str], ...] = ()  # an OK answer's trailing metadata

    async def unary(self, address: str, method: str, body: bytes, *, timeout: float | None,
                    metadata: tuple[tuple[str, str], ...], trailers: list | None = None, lane: str = "") -> bytes:
        tenant = dict(metadata).get(TENANT_HEADER, "")
        call = Call(address, method, body, timeout, tenant)
        self.calls.append(call)
        self.clock.advance(self.latency)
        if address in self.down:
            raise transport_error()
        answer = self.script.pop(0) if self.script else self.behaviour(call)
        if isinstance(answer, HostError):
            raise answer
        if trailers is not None:
            trailers.extend(self.trailing)
        return answer


def status(address: str, sent: float = 1.0, models: tuple[tuple[str, str, str], ...] = (), queue_depth: int = 0,
           free: int = 1 << 30, group: str = "") -> hc.HostStatus:
    """A hostd's HostStatus with (tenant, model, state) models, version "1"."""
    return hc.HostStatus(host_id=address, address=address, sent_unix=sent, device_memory_total=free, host_group=group,
                         models=[hc.ModelStatus(tenant=t, model=m, version="1", state=s, queue_depth=queue_depth)
                                 for t, m, s in models])


def cluster_of(*statuses: hc.HostStatus) -> ClusterView:
    view = ClusterView()
    view.apply({s.address: s for s in statuses}, complete=True)
    return view


def infer(model: str, request_id: str = "", timeout_us: int | None = None) -> bytes:
    req = pb.ModelInferRequest(model_name=model, id=request_id, raw_input_contents=[b"\0" * 32])
    if timeout_us is not None:
        req.parameters["timeout"].int64_param = timeout_us
    return req.SerializeToString()
