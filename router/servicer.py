"""The v2 inference service and Triton's extensions, as tenants see them on a router: a thin adapter. Every
method takes and returns raw bytes (a generic handler without deserializers), converts, and calls the parts
that decide: authentication, the tenant's catalog (directory), admission, then the dispatcher (placement,
forwarding, retries). ModelInfer reads only the routing header (router/header.py) and forwards the request
bytes unchanged. Errors are ServingErrors and become statuses in one place (ground/interceptors.py
with_error_boundary, applied to each handler where it is registered).

Bounds between tenants (PRODUCT.md, "Trust boundaries"):
- Bytes in flight: a ModelInfer call is authenticated and checked against its tenant's byte budget, for a body
  the size of its recent ones, before its body is read (`infer_call`: a tenant whose budget is full is refused
  before its body arrives; the router reads at most stream_window_bytes of a body it has not asked for); once
  whole, the body's size is charged to its tenant's and the router's
  budget (ground/inflight_policy.py), before the catalog check and forwarding, and given back when the answer
  is back; past the budget it is RESOURCE_EXHAUSTED `inflight_bytes` with retry-after-ms, and its bytes are
  dropped at once. Responses are not charged: each belongs to a charged
  request and lives only between the hostd's answer and this handler's return, while the request's charge
  still holds; both are bounded by max_message_bytes.
- Pinning is an operator action. A tenant's RepositoryModelLoad that carries a `pin` parameter (true or
  false) is PERMISSION_DENIED `permission_denied`, before the catalog check (so it says nothing about which
  models exist). Why not charge pins to the tenant's device share instead: a pinned model can never be
  evicted, so every pinned byte is taken from the pool all tenants share for as long as the pin lasts, and
  no per-request rule at a router (which does not see the device) can keep a set of pins from several
  routers within one host's budget. Operators pin on a hostd directly (its own port, behind mutual TLS),
  where the budget is known, and a tenant's unpin cannot undo an operator's pin.
- Without a catalog (no --store) an unload of a model no host holds is sent to every host and is NOT_FOUND
  unless some host knows the model: never OK for a name nobody has."""

from __future__ import annotations

import grpc
from google.protobuf.message import DecodeError
from grpc import aio

from ground import __version__
from ground.deadlines import deadline_at, remaining_s
from ground.errors import (Forwarded, InvalidArgument, PermissionDenied, ResourceExhausted, ServingError, Unauthenticated,
                           Unavailable)
from ground.interceptors import with_error_boundary
from ground.inflight_policy import InflightBytes, budget_of
from ground.params import param_int
from ground.settings import RouterSettings
from ground.wire import EXTENSIONS, SERVED, SERVICE, TENANT_HEADER, Reason, trailer
from protos import grpc_service_pb2 as pb
from router.accesslog import AccessLog
from router.admission import Admission
from router.admission_policy import ShedReason, check_deadline
from router.auth import AuthError, KeyIndex, cert_tenant
from router.cluster import ClusterView, model_key
from router.directory import ModelDirectory, not_found
from router.dispatcher import Clock, Dispatcher
from router.header import read_header
from router.host_client import HostError
from router.metrics import RouterMetrics
from router.stats_merge import merge_statistics
from router.streaming import stream_handler

__all__ = ["TENANT_HEADER", "RouterServicer"]
SHED_CODES = frozenset({"RESOURCE_EXHAUSTED", "UNAVAILABLE", "DEADLINE_EXCEEDED"})
# Every call but ModelInfer carries names and a few parameters; forwarded bodies bigger than this are refused
# (INVALID_ARGUMENT), so bytes in flight on those calls stay small without a budget of their own.
MAX_CONTROL_BODY = 1 << 20


def _parse(cls, body: bytes):
    try:
        return cls.FromString(body)
    except DecodeError as e:
        raise InvalidArgument(f"malformed {cls.__name__}: {e}") from None


class RouterServicer:
    def __init__(self, *, settings: RouterSettings, keys: KeyIndex, directory: ModelDirectory, cluster: ClusterView,
                 dispatcher: Dispatcher, metrics: RouterMetrics, access_log: AccessLog, clock: Clock,
                 wall_clock: Clock, admission: Admission | None = None, inflight: InflightBytes | None = None) -> None:
        """`clock`: monotonic seconds, the dispatcher's clock too; `wall_clock`: unix seconds (access log);
        `inflight`: the byte budget (default: from settings)."""
        self.settings = settings
        self.inflight = inflight or InflightBytes(budget_of(settings.inflight_bytes, settings.tenant_inflight_bytes,
                                                            settings.memory_limit))
        self.admission = admission or Admission()
        self.keys, self.directory, self.cluster, self.dispatcher = keys, directory, cluster, dispatcher
        self.metrics, self.access_log = metrics, access_log
        self.clock, self.wall_clock = clock, wall_clock

    def handler(self) -> grpc.GenericRpcHandler:
        names = ["ServerLive", "ServerReady", "ServerMetadata", "ModelReady", "ModelMetadata", "ModelConfig",
                 "ModelInfer", "ModelStatistics", "RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload"]
        handlers = {n: grpc.unary_unary_rpc_method_handler(_small(n, getattr(self, n))) for n in names if n != "ModelInfer"}
        # ModelInfer reads its own body (stream-unary on this side; a unary call on the wire), so it can refuse
        # before the body arrives
        handlers["ModelInfer"] = grpc.stream_unary_rpc_method_handler(self.infer_call)
        # a stream of ModelInfer requests, each taking ModelInfer's path (router/streaming.py)
        handlers["ModelStreamInfer"] = grpc.stream_stream_rpc_method_handler(stream_handler(self))
        return grpc.method_handlers_generic_handler(SERVICE, {n: with_error_boundary(h) for n, h in handlers.items()})

    # -- front door -------------------------------------------------------------------------------

    def _tenant(self, context: aio.ServicerContext) -> str:
        """An API key, or a tenant client certificate when the router asks for them (router/auth.py)."""
        cert = cert_tenant(context) if self.settings.tls_client_ca is not None else None
        try:
            return self.keys.authenticate(context.invocation_metadata(), cert)
        except AuthError as e:
            self.metrics.unauthenticated.inc()
            raise Unauthenticated(str(e)) from None

    authenticate = _tenant  # the same front door for the router's other services (router/uploads.py)

    def _deadline(self, context: aio.ServicerContext, now: float, timeout_us: int | None = None) -> float:
        """The call's absolute deadline on `self.clock` (INF for none): ground/deadlines.py's one rule, for
        admission and forwarding alike."""
        return deadline_at(now, context.time_remaining(), timeout_us, self.settings.default_timeout_s)

    async def _forward(self, tenant: str, model: str, version: str, method: str, body: bytes,
                       context: aio.ServicerContext, *, loads: bool = True) -> bytes:
        deadline = self._deadline(context, self.clock())
        return (await self.dispatcher.forward(tenant, model, version, method, body, deadline=deadline,
                                              loads=loads))[0]

    # -- admission ----------------------------------------------------------------------------------

    def _admit(self, tenant: str, model: str, version: str, deadline: float) -> None:
        """Quotas, then deadline feasibility; a refusal raises (and holds no place), an admission holds one
        concurrency place until `self._leave(tenant)`."""
        now = self.clock()
        times = self.cluster.recent_times(model_key(tenant, model, version))
        feas = check_deadline(remaining_s(deadline, now), times, model)
        busy_ms = int(feas.expected_ms) if feas.expected_ms else 10
        d = self.admission.enter(tenant, now, busy_retry_ms=busy_ms)
        if not d.admit:
            assert d.reason is not None  # a refusal always says why
            raise ResourceExhausted(d.message, retry_after_ms=d.retry_after_ms, reason=d.reason.value)
        if not feas.admit:
            self.admission.leave(tenant)
            raise Unavailable(feas.message, retry_after_ms=feas.retry_after_ms, reason=ShedReason.DEADLINE_INFEASIBLE.value)
        self.metrics.admitted_inflight.inc()

    def _leave(self, tenant: str) -> None:
        self.admission.leave(tenant)
        self.metrics.admitted_inflight.dec()

    # -- inference ----------------------------------------------------------------------------------

    async def infer_call(self, request_iterator, context: aio.ServicerContext) -> bytes:
        """ModelInfer as served: the caller is authenticated and its byte budget must have room for a body
        the size of its recent ones (InflightBytes.expected) before this one is read, so a tenant whose budget is
        full is refused before its body arrives, and a tenant of large bodies has few arriving at once. Once the
        body is whole, ModelInfer charges its real size."""
        tenant = self._tenant(context)
        reserve = self.inflight.expected(tenant)
        grant = self.inflight.acquire(tenant, reserve)
        if not grant.granted:
            self.metrics.requests.labels(tenant, "(unknown)", "RESOURCE_EXHAUSTED").inc()
            self.metrics.shed.labels(tenant, "(unknown)", Reason.INFLIGHT_BYTES.value).inc()
            raise ResourceExhausted(grant.message, retry_after_ms=grant.retry_after_ms,
                                    reason=Reason.INFLIGHT_BYTES.value)
        try:
            body = await context.read()
        finally:
            self.inflight.release(tenant, reserve)
        if not isinstance(body, bytes):  # aio.EOF: the call carried no request message
            raise InvalidArgument("ModelInfer needs one request message")
        self.inflight.observe(tenant, len(body))
        return await self.ModelInfer(body, context, tenant)

    async def ModelInfer(self, body: bytes, context: aio.ServicerContext, tenant: str | None = None) -> bytes:
        ts, t0 = self.wall_clock(), self.clock()
        tenant = tenant or self._tenant(context)
        hdr = read_header(body)
        model, version = hdr.model_name, hdr.model_version
        deadline = self._deadline(context, t0, _param_int(hdr.parameters, "timeout"))
        status, host, resp, known, reason = "OK", "", b"", False, ""
        trailers: list | None = [] if self.access_log.enabled else None  # the hostd's mmhost-served, for the log
        served: str | None = None  # the hostd's mmhost-served trailer, as sent: the access log's thread decodes it
        charged = 0
        try:
            if not model:
                raise InvalidArgument("model_name is required")
            grant = self.inflight.acquire(tenant, len(body))
            if not grant.granted:
                raise ResourceExhausted(grant.message, retry_after_ms=grant.retry_after_ms,
                                        reason=Reason.INFLIGHT_BYTES.value)
            charged = len(body)
            await self.directory.check(tenant, model, version)
            known = True
            await self.admission.ready(tenant)  # Redis mode: the tenant's fleet token lease, topped up when low
            self._admit(tenant, model, version, deadline)
            try:
                resp, host = await self.dispatcher.forward(tenant, model, version, "ModelInfer", body,
                                                           deadline=deadline, trailers=trailers)
            finally:
                self._leave(tenant)
            if trailers:
                served = trailer(trailers, SERVED)
            return resp
        except ServingError as e:
            status, reason = e.code.name, e.wire_reason
            if isinstance(e, Forwarded):
                host = e.host
                served = e.served
            elif e.reason and status in SHED_CODES:
                # the router's own refusal; a hostd counts the ones it forwards
                self.metrics.shed.labels(tenant, model if known else "(unknown)", e.reason).inc()
            raise
        except Exception:
            status, reason = "INTERNAL", Reason.INTERNAL.value
            raise
        finally:
            if charged:
                self.inflight.release(tenant, charged)
            total = self.clock() - t0
            self.metrics.answered(tenant, model if known else "(unknown)", status, total)
            if trailers is not None:
                self._log(ts, tenant, model, version, host, total, status, reason, len(body), resp, hdr.id, served)

    def _log(self, ts: float, tenant: str, model: str, version: str, host: str, total: float, status: str,
             reason: str, bytes_in: int, resp: bytes, rid: str, served: str | None) -> None:
        """One access log line (router/accesslog.py): what the hostd said served it (its `mmhost-served` trailer,
        decoded off the event loop by the access log's writer), else what is known here. A malformed trailer
        (not from a hostd) leaves the line with the version asked for and no size."""
        if served:
            self.access_log.write(ts=ts, tenant=tenant, model=model, version=version, host=host,
                                  total_ms=total * 1000, status=status, bytes_in=bytes_in, bytes_out=len(resp),
                                  id=rid, reason=reason, served=served)
            return
        if resp:  # a hostd that sent no mmhost-served: the response names the version
            try:
                version = read_header(resp).model_version or version
            except InvalidArgument:
                pass
        size = self.cluster.size_of(model_key(tenant, model, version)) if model else 0
        self.access_log.write(ts=ts, tenant=tenant, model=model, version=version, host=host, total_ms=total * 1000,
                              status=status, bytes_in=bytes_in, bytes_out=len(resp), id=rid,
                              size_bytes=size or None, reason=reason)

    # -- server-level calls, answered here --------------------------------------------------------

    async def ServerLive(self, body: bytes, context) -> bytes:
        self._tenant(context)
        return pb.ServerLiveResponse(live=True).SerializeToString()

    async def ServerReady(self, body: bytes, context) -> bytes:
        self._tenant(context)
        return pb.ServerReadyResponse(ready=bool(self.cluster.eligible())).SerializeToString()

    async def ServerMetadata(self, body: bytes, context) -> bytes:
        self._tenant(context)
        return pb.ServerMetadataResponse(name="mmhost-router", version=__version__,
                                         extensions=list(EXTENSIONS)).SerializeToString()

    # -- model-level calls, checked against the tenant's catalog, then forwarded ------------------------

    async def ModelReady(self, body: bytes, context) -> bytes:
        tenant = self._tenant(context)
        req = _parse(pb.ModelReadyRequest, body)
        try:
            await self.directory.check(tenant, req.name, req.version)
        except ServingError:
            return pb.ModelReadyResponse(ready=False).SerializeToString()
        return await self._forward(tenant, req.name, req.version, "ModelReady", body, context, loads=False)

    async def ModelMetadata(self, body: bytes, context) -> bytes:
        tenant = self._tenant(context)
        req = _parse(pb.ModelMetadataRequest, body)
        await self.directory.check(tenant, req.name, req.version)
        return await self._forward(tenant, req.name, req.version, "ModelMetadata", body, context, loads=False)

    async def ModelConfig(self, body: bytes, context) -> bytes:
        tenant = self._tenant(context)
        req = _parse(pb.ModelConfigRequest, body)
        await self.directory.check(tenant, req.name, req.version)
        return await self._forward(tenant, req.name, req.version, "ModelConfig", body, context, loads=False)

    async def RepositoryModelLoad(self, body: bytes, context) -> bytes:
        tenant = self._tenant(context)
        req = _parse(pb.RepositoryModelLoadRequest, body)
        if not req.model_name:
            raise InvalidArgument("model_name is required")
        if "pin" in req.parameters:
            raise PermissionDenied("pinning a model is an operator action (RepositoryModelLoad with 'pin' on a "
                                   "hostd directly); load without the 'pin' parameter",
                                   reason=Reason.PERMISSION_DENIED.value)
        v = req.parameters.get("version")
        version = v.string_param if v is not None and v.WhichOneof("parameter_choice") == "string_param" else ""
        await self.directory.check(tenant, req.model_name, version)
        return await self._forward(tenant, req.model_name, version, "RepositoryModelLoad", body, context)

    async def RepositoryModelUnload(self, body: bytes, context) -> bytes:
        """Unload from every host that holds the model."""
        tenant = self._tenant(context)
        req = _parse(pb.RepositoryModelUnloadRequest, body)
        if not req.model_name:
            raise InvalidArgument("model_name is required")
        await self.directory.check(tenant, req.model_name)
        hosts = self.cluster.holders(model_key(tenant, req.model_name))
        if not hosts and not self.directory.enabled:  # no catalog here to say the model exists: ask every host
            hosts = [h.address for h in self.cluster.eligible()]
            if not hosts:
                raise Unavailable("no host is up to unload the model on; retry later", retry_after_ms=1000,
                                  reason=Reason.NO_HOST.value)
        known = self.directory.enabled  # with a catalog, check() above said the model exists
        for r in await self.dispatcher.broadcast(tenant, hosts, "RepositoryModelUnload", body,
                                                 timeout=context.time_remaining()):
            if not isinstance(r, HostError):
                known = True
            elif r.code is not grpc.StatusCode.NOT_FOUND:
                raise r.forwarded()
        if not known:
            raise not_found(req.model_name)
        return pb.RepositoryModelUnloadResponse().SerializeToString()

    async def RepositoryIndex(self, body: bytes, context) -> bytes:
        """The caller's models only, from the catalog, with their best state on any host."""
        tenant = self._tenant(context)
        req = _parse(pb.RepositoryIndexRequest, body)
        if not self.directory.enabled:
            return await self._forward(tenant, "", "", "RepositoryIndex", body, context, loads=False)
        states = self.cluster.states(tenant)
        out = []
        for model, versions in await self.directory.listing(tenant):
            for v in versions:
                state = states.get((model, v), "UNAVAILABLE")
                if req.ready and state != "READY":
                    continue
                out.append(pb.RepositoryIndexResponse.ModelIndex(name=model, version=v, state=state))
        return pb.RepositoryIndexResponse(models=out).SerializeToString()

    async def ModelStatistics(self, body: bytes, context) -> bytes:
        """Every host's statistics for the caller's models, added up (router/stats_merge.py)."""
        tenant = self._tenant(context)
        req = _parse(pb.ModelStatisticsRequest, body)
        if req.name:
            await self.directory.check(tenant, req.name, req.version)
        hosts = [h.address for h in self.cluster.eligible()]
        results = await self.dispatcher.broadcast(tenant, hosts, "ModelStatistics", body,
                                                  timeout=context.time_remaining() or 10.0)
        answers = []
        for r in results:
            if isinstance(r, HostError):
                if r.code is grpc.StatusCode.NOT_FOUND:
                    raise not_found(req.name, req.version)
                continue  # a host that cannot answer is left out
            answers.append(pb.ModelStatisticsResponse.FromString(r))
        return merge_statistics(answers, req.name, req.version).SerializeToString()


def _small(name: str, method):
    async def call(body: bytes, context) -> bytes:
        if len(body) > MAX_CONTROL_BODY:
            raise InvalidArgument(f"{name} request of {len(body)} bytes; at most {MAX_CONTROL_BODY} are accepted")
        return await method(body, context)

    return call


def _param_int(params, name: str) -> int | None:
    """Malformed parameters are left for the hostd to refuse with INVALID_ARGUMENT."""
    try:
        return param_int(params, name)
    except ValueError:
        return None
