"""The v2 inference service and Triton's extensions on a hostd: a thin adapter between protobuf and the
model manager. Errors are raised as ServingError and become statuses in hostd/interceptors.py.

Tenancy: a router sets the `mmhost-tenant` metadata on what it forwards. A call without it (a direct
call on a hostd's internal port) acts as the configured default tenant.
"""

from __future__ import annotations

import asyncio
import time

from grpc import aio

from hostd.batch_policy import INF
from ground.errors import InvalidArgument, NotFound, ServingError, Unavailable
from hostd.manager import ModelEntry, ModelManager
from hostd.metrics import HostdMetrics
from hostd.model_state import ModelState
from hostd.tensors import decode_request, encode_response
from ground import __version__
from ground.manifest import ModelManifest
from ground.params import param_int
from ground.wire import EXTENSIONS, TENANT_HEADER
from protos import grpc_service_pb2 as pb
from protos import grpc_service_pb2_grpc as pb_grpc
from protos import model_config_pb2 as mc



def tenant_of(context: aio.ServicerContext, default: str) -> str:
    for k, v in context.invocation_metadata() or ():
        if k == TENANT_HEADER:
            return v
    return default


def _param_int(params, name: str) -> int | None:
    try:
        return param_int(params, name)
    except ValueError as e:
        raise InvalidArgument(str(e)) from None


def model_config(m: ModelManifest) -> mc.ModelConfig:
    batched = bool(m.max_batch_size)

    def dims(shape: list[int]) -> list[int]:
        return shape[1:] if batched else shape

    def dtype(d: str) -> int:
        return mc.DataType.Value("TYPE_STRING" if d == "BYTES" else f"TYPE_{d}")

    cfg = mc.ModelConfig(
        name=m.model,
        platform=m.format.platform,
        backend="onnxruntime" if m.format.value == "onnx" else "pytorch",
        max_batch_size=m.max_batch_size or 0,
        input=[mc.ModelInput(name=t.name, data_type=dtype(t.datatype), dims=dims(t.shape)) for t in m.inputs],
        output=[mc.ModelOutput(name=t.name, data_type=dtype(t.datatype), dims=dims(t.shape)) for t in m.outputs],
        instance_group=[mc.ModelInstanceGroup(name=f"{m.model}_0", count=m.instance_count, kind=mc.ModelInstanceGroup.KIND_AUTO)],
        default_model_filename=m.model_file,
    )
    if batched:
        b = m.batching
        q = m.queue_policy
        cfg.dynamic_batching.CopyFrom(
            mc.ModelDynamicBatching(
                preferred_batch_size=b.preferred_batch_sizes,
                max_queue_delay_microseconds=b.max_queue_delay_us,
                priority_levels=b.priority_levels,
                default_priority_level=b.default_priority_level,
                default_queue_policy=mc.ModelQueuePolicy(
                    timeout_action=mc.ModelQueuePolicy.DELAY if q.timeout_action == "delay" else mc.ModelQueuePolicy.REJECT,
                    default_timeout_microseconds=q.default_timeout_us,
                    allow_timeout_override=q.allow_timeout_override,
                    max_queue_size=q.max_queue_size,
                ),
            )
        )
    return cfg


class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, manager: ModelManager, metrics: HostdMetrics, default_tenant: str) -> None:
        self.manager = manager
        self.metrics = metrics
        self.default_tenant = default_tenant
        self.draining = False
        self.started = False  # set once preloading (if any) is done
        self.inflight = 0
        self.requests_by_tenant: dict[str, int] = {}
        self.shed_by_tenant: dict[str, int] = {}
        self._quiet = asyncio.Event()
        self._quiet.set()

    def _is_ready(self) -> bool:
        return self.started and not self.draining

    async def wait_quiet(self, timeout_s: float) -> bool:
        """Wait until no inference request is in flight; False if the timeout passed first."""
        try:
            await asyncio.wait_for(self._quiet.wait(), timeout_s)
            return True
        except asyncio.TimeoutError:
            return False

    def _tenant(self, context) -> str:
        return tenant_of(context, self.default_tenant)

    async def ServerLive(self, request, context):
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request, context):
        return pb.ServerReadyResponse(ready=self._is_ready())

    async def ServerMetadata(self, request, context):
        return pb.ServerMetadataResponse(name="mmhost", version=__version__, extensions=list(EXTENSIONS))

    async def ModelReady(self, request, context):
        """Ready means a request would be served: READY, or loadable on demand (lazy loading is transparent).
        A model in its FAILED backoff, or unknown, is not ready."""
        try:
            e = await self.manager.resolve(self._tenant(context), request.name, request.version or None)
        except NotFound:
            return pb.ModelReadyResponse(ready=False)
        ok = e.state is ModelState.READY or (e.state is not ModelState.FAILED or e.retry_at <= time.monotonic())
        return pb.ModelReadyResponse(ready=ok and self._is_ready())

    async def ModelMetadata(self, request, context):
        tenant = self._tenant(context)
        e = await self.manager.resolve(tenant, request.name, request.version or None)
        m = e.manifest
        return pb.ModelMetadataResponse(
            name=m.model,
            versions=await self.manager.versions(tenant, m.model),
            platform=m.format.platform,
            inputs=[pb.ModelMetadataResponse.TensorMetadata(name=t.name, datatype=t.datatype, shape=t.shape) for t in m.inputs],
            outputs=[pb.ModelMetadataResponse.TensorMetadata(name=t.name, datatype=t.datatype, shape=t.shape) for t in m.outputs],
        )

    async def ModelConfig(self, request, context):
        e = await self.manager.resolve(self._tenant(context), request.name, request.version or None)
        return pb.ModelConfigResponse(config=model_config(e.manifest))

    async def ModelInfer(self, request, context):
        self.inflight += 1
        self._quiet.clear()
        try:
            return await self._infer(request, context)
        finally:
            self.inflight -= 1
            if self.inflight == 0:
                self._quiet.set()

    async def _infer(self, request, context):
        t0 = time.monotonic()
        tenant = self._tenant(context)
        model = request.model_name
        e: ModelEntry | None = None
        try:
            if self.draining:
                raise Unavailable("server is draining; retry on another host", reason="draining", retry_after_ms=50)
            if not model:
                raise InvalidArgument("model_name is required")
            e = await self.manager.resolve(tenant, model, request.model_version or None)
            m = e.manifest
            deadline = self._deadline(request, context, t0)
            decoded = decode_request(request, m, self.manager.settings.max_request_bytes)
            runner = await self.manager.ready_runner(e, deadline)
            priority = self._priority(request, m, self.manager.tenants.get(tenant).default_priority)
            outputs = await runner.infer(decoded, priority, deadline)
            resp = encode_response(request, m, outputs, decoded.outputs, decoded.raw)
        except ServingError as err:
            self._count(tenant, model, err.code.name, t0, e=e, err=err)
            raise
        self._count(tenant, model, "OK", t0, e=e)
        return resp

    def _deadline(self, request, context, now: float) -> float:
        deadline = INF
        remaining = context.time_remaining()
        if remaining is not None:
            deadline = now + remaining
        timeout_us = _param_int(request.parameters, "timeout")
        if timeout_us is not None and timeout_us > 0:
            deadline = min(deadline, now + timeout_us / 1e6)
        return deadline

    @staticmethod
    def _priority(request, m: ModelManifest, tenant_default: int = 0) -> int:
        """v2 / Triton semantics: 1 is the highest priority; 0 (or absent) is the tenant's default level,
        else the model's default level."""
        p = _param_int(request.parameters, "priority") or 0
        levels = m.batching.priority_levels
        if p == 0 and tenant_default and (not levels or tenant_default <= levels):
            p = tenant_default
        if p < 0 or (levels and p > levels):
            raise InvalidArgument(f"priority {p} is outside the model's levels 1..{levels or 'N'} (0 = default)")
        return p or (m.batching.default_priority_level or max(levels, 1))

    def _count(self, tenant: str, model: str, status: str, t0: float, e: ModelEntry | None = None, err=None) -> None:
        known = e is not None
        label_model = model if known else "(unknown)"  # unknown names never become label values
        self.metrics.requests.labels(tenant, label_model, status).inc()
        self.requests_by_tenant[tenant] = self.requests_by_tenant.get(tenant, 0) + 1
        self.metrics.request_duration.labels(tenant, label_model).observe(time.monotonic() - t0)
        if e is not None:
            e.stats.rate.hit(time.monotonic())
            if status == "OK":
                e.stats.success.add(int((time.monotonic() - t0) * 1e9))
                e.stats.last_inference_ms = int(time.time() * 1000)
            else:
                e.stats.fail.add(int((time.monotonic() - t0) * 1e9))
        if err is not None and status in ("RESOURCE_EXHAUSTED", "UNAVAILABLE", "DEADLINE_EXCEEDED") and err.reason:
            self.metrics.shed.labels(tenant, label_model, err.reason).inc()
            self.shed_by_tenant[tenant] = self.shed_by_tenant.get(tenant, 0) + 1
            if e is not None:
                e.stats.shed += 1

    async def ModelStatistics(self, request, context):
        tenant = self._tenant(context)
        out = []
        for (t, mname, v), e in sorted(self.manager.entries.items()):
            if t != tenant or (request.name and mname != request.name) or (request.version and v != request.version):
                continue
            out.append(e.stats.to_proto(mname, v))
        if request.name and not out:
            await self.manager.resolve(tenant, request.name, request.version or None)  # NotFound if unknown
            return pb.ModelStatisticsResponse(model_stats=[pb.ModelStatistics(name=request.name, version=request.version)])
        return pb.ModelStatisticsResponse(model_stats=out)

    async def RepositoryIndex(self, request, context):
        tenant = self._tenant(context)
        models = []
        for mname, versions in await self.manager.catalog_models(tenant):
            for v in versions:
                e = self.manager.entries.get((tenant, mname, v))
                state = e.state if e is not None else ModelState.ABSENT
                if request.ready and state is not ModelState.READY:
                    continue
                models.append(
                    pb.RepositoryIndexResponse.ModelIndex(
                        name=mname, version=v, state=state.triton_state, reason=(e.error if e is not None else "")
                    )
                )
        return pb.RepositoryIndexResponse(models=models)

    async def RepositoryModelLoad(self, request, context):
        if not request.model_name:
            raise InvalidArgument("model_name is required")
        p = request.parameters.get("pin")
        pin = p.bool_param if p is not None and p.WhichOneof("parameter_choice") == "bool_param" else None
        v = request.parameters.get("version")
        version = v.string_param if v is not None and v.WhichOneof("parameter_choice") == "string_param" else None
        await self.manager.load(self._tenant(context), request.model_name, version, pin=pin)
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(self, request, context):
        if not request.model_name:
            raise InvalidArgument("model_name is required")
        await self.manager.unload_model(self._tenant(context), request.model_name)
        return pb.RepositoryModelUnloadResponse()
