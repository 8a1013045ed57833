"""The v2 inference service and Triton's extensions on a hostd: a thin adapter. Each handler reads the
tenant (and, for inference, the time left) off the call, calls the data plane (hostd/dataplane.py) and
turns what it answers into a response message. Errors are raised as ServingError and become statuses in
one interceptor (ground/interceptors.py).

Request bodies reach these handlers already decoded, but not by grpc: the ErrorInterceptor
(ground/interceptors.py) takes each method's raw bytes and decodes them itself, so an undecodable body on any
RPC is INVALID_ARGUMENT with `mmhost-reason`, never grpc's UNKNOWN (which a router reads as a failed transport
and would mark this host down for). Registration stays the generated `add_GRPCInferenceServiceServicer_to_server`.

Tenancy: a router sets the `mmhost-tenant` metadata on what it forwards (with mutual TLS on, only a caller
with the router's certificate gets this far: ground.tls.PeerCheckInterceptor). A call without it is refused
(UNAUTHENTICATED, "no tenant"), except in dev mode (HostdSettings.dev_mode), where it acts as the configured
default tenant.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from grpc import aio

from ground import __version__
from ground.errors import ServingError, Unauthenticated
from ground.served import Served
from ground.wire import EXTENSIONS, LANE_HEADER, SERVED, TENANT_HEADER
from hostd.dataplane import DataPlane
from hostd.metrics import HostdMetrics
from hostd.model_config import model_config
from hostd import streaming
from hostd.wire_request import RAW_INPUTS
from protos import grpc_service_pb2 as pb
from protos import grpc_service_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    from hostd.manager import ModelManager

__all__ = ["InferenceServicer", "model_config", "tenant_of", "TENANT_HEADER"]


def tenant_of(context: aio.ServicerContext, default: str | None) -> str:
    """The call's `mmhost-tenant`; without it `default` (dev mode), or UNAUTHENTICATED when there is none."""
    return _tenant_and_served(context, default)[0]


def _tenant_and_served(context: aio.ServicerContext, default: str | None) -> tuple[str, bool]:
    """The tenant (as tenant_of) and whether the answer should carry `mmhost-served`, in one pass over the
    metadata: gRPC builds the tuple anew on every invocation_metadata() call.

    `mmhost-served` is for a router's access log, so only a call from a router's Python lane gets it: one that
    carries `mmhost-tenant` and not `mmhost-lane: fast`. A fast-lane call (HAProxy sets the lane) gets none:
    HAProxy cannot log trailers and would pass them on to the tenant, and sending the value as a header instead
    costs a second write per call (measured: +250 us of hostd CPU per request at concurrency 1, +600 us
    through HAProxy). A direct call in dev mode (no `mmhost-tenant`, the default tenant) gets none either:
    Triton's clients and tools never read it, and the trailer cost hostd about 6% of its throughput at
    concurrency 32 (bench/batching.py's model, three interleaved rounds: 1,466-1,566 req/s without, 1,366-1,440
    with)."""
    tenant, fast = None, False
    for k, v in context.invocation_metadata() or ():
        if k == TENANT_HEADER:
            if tenant is None:
                tenant = v
        elif k == LANE_HEADER and v == "fast":
            fast = True
    if tenant is not None:
        return tenant, not fast
    if default is None:
        raise no_tenant()
    return default, False


def no_tenant() -> Unauthenticated:
    return Unauthenticated(f"no tenant: a hostd serves calls that carry {TENANT_HEADER} metadata (from a router)")


async def infer_served(plane: DataPlane, tenant: str, request: pb.ModelInferRequest, remaining: float | None,
                       raw) -> tuple[pb.ModelInferResponse, Served]:
    """One ModelInfer through the data plane, with what served it (ground/served.py); a ServingError it raises
    carries `mmhost-served` once the model version is known (unary calls here, HostdData frames:
    hostd/forwarded.py)."""
    served = Served()
    try:
        return await plane.infer(tenant, request, remaining, served, raw=raw), served
    except ServingError as e:
        if served.version:  # one error object may fail a whole batch: replace, never append to, its trailer
            e.trailers = (*(t for t in e.trailers if t[0] != SERVED), (SERVED, served.encode()))
        raise


def _repo_param(params, name: str, kind: str):
    """A RepositoryModelLoad parameter of one kind (`bool_param`, `string_param`); None when absent or
    of another kind."""
    p = params.get(name)
    return getattr(p, kind) if p is not None and p.WhichOneof("parameter_choice") == kind else None


def _tensor_metadata(specs) -> list[pb.ModelMetadataResponse.TensorMetadata]:
    return [pb.ModelMetadataResponse.TensorMetadata(name=t.name, datatype=t.datatype, shape=t.shape) for t in specs]


class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, manager: ModelManager, metrics: HostdMetrics, default_tenant: str | None,
                 plane: DataPlane | None = None) -> None:
        self.plane = plane or DataPlane(manager, metrics)
        self.default_tenant = default_tenant

    # The server's view of the host's traffic, kept by the data plane (hostd/server.py sets `started` and
    # `draining`, reads the counters for its status and waits on `wait_quiet` when draining).
    @property
    def manager(self) -> ModelManager:
        return self.plane.manager

    @property
    def metrics(self) -> HostdMetrics:
        return self.plane.metrics

    @property
    def draining(self) -> bool:
        return self.plane.draining

    @draining.setter
    def draining(self, value: bool) -> None:
        self.plane.draining = value

    @property
    def started(self) -> bool:
        return self.plane.started

    @started.setter
    def started(self, value: bool) -> None:
        self.plane.started = value

    @property
    def inflight(self) -> int:
        return self.plane.inflight

    @property
    def requests_by_tenant(self) -> dict[str, int]:
        return self.plane.requests_by_tenant

    @property
    def shed_by_tenant(self) -> dict[str, int]:
        return self.plane.shed_by_tenant

    async def wait_quiet(self, timeout_s: float) -> bool:
        return await self.plane.wait_quiet(timeout_s)

    def _tenant(self, context) -> str:
        return tenant_of(context, self.default_tenant)

    # ---- server ---------------------------------------------------------------------------------------
    async def ServerLive(self, request, context):
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request, context):
        return pb.ServerReadyResponse(ready=self.plane.ready())

    async def ServerMetadata(self, request, context):
        return pb.ServerMetadataResponse(name="mmhost", version=__version__, extensions=list(EXTENSIONS))

    # ---- models ---------------------------------------------------------------------------------------
    async def ModelReady(self, request, context):
        return pb.ModelReadyResponse(ready=await self.plane.model_ready(self._tenant(context), request.name,
                                                                        request.version or None))

    async def ModelMetadata(self, request, context):
        info = await self.plane.model_metadata(self._tenant(context), request.name, request.version or None)
        m = info.manifest
        return pb.ModelMetadataResponse(name=m.model, versions=info.versions, platform=m.format.platform,
                                        inputs=_tensor_metadata(m.inputs), outputs=_tensor_metadata(m.outputs))

    async def ModelConfig(self, request, context):
        m = await self.plane.model_manifest(self._tenant(context), request.name, request.version or None)
        return pb.ModelConfigResponse(config=model_config(m))

    async def ModelInfer(self, request, context):
        """A router's call's answer carries `mmhost-served` (ground/served.py; which calls: _tenant_and_served);
        a failed call's does whenever the model version is known."""
        tenant, trailer = _tenant_and_served(context, self.default_tenant)
        resp, served = await infer_served(self.plane, tenant, request, context.time_remaining(), RAW_INPUTS.get())
        if trailer:  # a router's Python lane: its access log reads it (_tenant_and_served)
            context.set_trailing_metadata(((SERVED, served.encode()),))
        return resp

    async def ModelStreamInfer(self, request_iterator, context):
        """Triton's bidirectional streaming: each request answered as it completes (hostd/streaming.py)."""
        await streaming.serve(self.plane, self._tenant, context)

    async def ModelStatistics(self, request, context):
        rows = await self.plane.statistics(self._tenant(context), request.name, request.version)
        return pb.ModelStatisticsResponse(model_stats=[
            r.stats.to_proto(r.name, r.version) if r.stats is not None else pb.ModelStatistics(name=r.name, version=r.version)
            for r in rows
        ])

    # ---- repository -----------------------------------------------------------------------------------
    async def RepositoryIndex(self, request, context):
        rows = await self.plane.repository_index(self._tenant(context), request.ready)
        return pb.RepositoryIndexResponse(models=[
            pb.RepositoryIndexResponse.ModelIndex(name=r.name, version=r.version, state=r.state.triton_state,
                                                  reason=r.reason)
            for r in rows
        ])

    async def RepositoryModelLoad(self, request, context):
        await self.plane.load(self._tenant(context), request.model_name,
                              _repo_param(request.parameters, "version", "string_param"),
                              pin=_repo_param(request.parameters, "pin", "bool_param"))
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(self, request, context):
        await self.plane.unload(self._tenant(context), request.model_name)
        return pb.RepositoryModelUnloadResponse()

