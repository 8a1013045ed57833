"""The v2 inference service and Triton's extensions, as tenants see them on a router. Every method takes
and returns raw bytes (a generic handler without deserializers); ModelInfer reads only InferHeader
(model, version, id, parameters) and forwards the request bytes unchanged. Errors are ServingErrors and
become statuses in hostd's ErrorInterceptor."""

from __future__ import annotations

import asyncio
import logging
import random
import time

import grpc
from google.protobuf.message import DecodeError
from grpc import aio

from ground.errors import (DeadlineExceeded, Forwarded, InvalidArgument, ResourceExhausted, ServingError, Unauthenticated,
                           Unavailable)
from ground.settings import RouterSettings
from ground.wire import EXTENSIONS, TENANT_HEADER, reason_of
from ground.params import param_int
from ground import __version__
from protos import grpc_service_pb2 as pb
from protos.router_header_pb2 import InferHeader
from router.accesslog import AccessLog
from router.admission import Admission
from router.admission_policy import ShedReason, check_deadline
from router.auth import KeyIndex, bearer
from router.cluster import ClusterView, model_key
from router.directory import ModelDirectory, not_found
from router.failover import Outcome, RetryBudget, classify, retry_after_ms
from router.forward import SERVICE, Forwarder
from router.local_load import LocalLoad
from router.metrics import RouterMetrics
from router.placement_policy import Placement, PlacementConfig, Reason, place, placement_config

log = logging.getLogger(__name__)
SHED_CODES = frozenset({"RESOURCE_EXHAUSTED", "UNAVAILABLE", "DEADLINE_EXCEEDED"})


def _parse(cls, body: bytes):
    try:
        return cls.FromString(body)
    except DecodeError as e:
        raise InvalidArgument(f"malformed {cls.__name__}: {e}") from None


class RouterServicer:
    def __init__(self, *, settings: RouterSettings, keys: KeyIndex, directory: ModelDirectory, cluster: ClusterView,
                 local: LocalLoad, forwarder: Forwarder, metrics: RouterMetrics, access_log: AccessLog,
                 rng: random.Random | None = None, admission: Admission | None = None) -> None:
        self.settings = settings
        self.admission = admission or Admission()
        self.keys, self.directory, self.cluster, self.local = keys, directory, cluster, local
        self.forwarder, self.metrics, self.access_log = forwarder, metrics, access_log
        self.pcfg: PlacementConfig = placement_config(settings)
        self.budget = RetryBudget(settings.retry_budget_ratio, settings.retry_budget_cap)
        self.rng = rng or random.Random()
        self._background: set[asyncio.Task] = set()

    def handler(self) -> grpc.GenericRpcHandler:
        names = ["ServerLive", "ServerReady", "ServerMetadata", "ModelReady", "ModelMetadata", "ModelConfig",
                 "ModelInfer", "ModelStatistics", "RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload"]
        return grpc.method_handlers_generic_handler(
            SERVICE, {n: grpc.unary_unary_rpc_method_handler(getattr(self, n)) for n in names})

    # -- front door -------------------------------------------------------------------------------

    def _tenant(self, context: aio.ServicerContext) -> str:
        tenant = self.keys.tenant(bearer(context.invocation_metadata()))
        if tenant is None:
            self.metrics.unauthenticated.inc()
            raise Unauthenticated("missing or invalid API key: send metadata 'authorization: Bearer <key>'")
        return tenant

    def _deadline(self, context: aio.ServicerContext, now: float) -> float | None:
        remaining = context.time_remaining()
        if remaining is not None:
            return now + remaining
        return now + self.settings.default_timeout_s if self.settings.default_timeout_s else None

    # -- placement and forwarding -----------------------------------------------------------------

    def _place(self, key: str, excluded: set[str], now: float) -> Placement:
        hosts = [h for h in self.cluster.eligible() if h.address not in excluded]
        return place(key, hosts, now, local_inflight=self.local.inflight_for(key), pending=self.local.pending_for(key),
                     rate=self.local.hit(key, now), size_bytes=self.cluster.size_of(key),
                     draws=(self.rng.random(), self.rng.random()), cfg=self.pcfg)

    async def _forward(self, tenant: str, model: str, version: str, method: str, body: bytes,
                       context: aio.ServicerContext, *, loads: bool = True) -> tuple[bytes, str]:
        """Place and forward, retrying on another host within the attempt limit, the retry budget and the
        deadline. Returns (response bytes, host). `loads`: this call makes the host load the model."""
        key = model_key(tenant, model, version)
        md = ((TENANT_HEADER, tenant),)
        deadline = self._deadline(context, time.monotonic())
        excluded: set[str] = set()
        self.budget.deposit()
        last: ServingError | None = None
        for attempt in range(1, self.settings.max_attempts + 1):
            now = time.monotonic()
            p = self._place(key, excluded, now)
            if p.host is None:
                raise last or Unavailable("no host is available", retry_after_ms=500, reason="no_host")
            self.metrics.placements.labels(p.reason.value).inc()
            if loads and p.reason is Reason.LOAD:
                self.local.started_load(key, p.host, now)
            if p.replicate_to is not None:
                self._replicate(tenant, model, version, key, p.replicate_to, now)
            timeout = None if deadline is None else deadline - now
            if timeout is not None and timeout <= 0:
                raise DeadlineExceeded("deadline exceeded before the request could be forwarded", reason="deadline")
            self.local.begin(key, p.host)
            try:
                return await self.forwarder.unary(p.host, method, body, timeout=timeout, metadata=md), p.host
            except aio.AioRpcError as e:
                trailing = e.trailing_metadata()
                outcome = classify(e.code(), trailing)
                err = Forwarded(e.code(), e.details() or "", retry_after_ms(trailing), reason_of(trailing) or "")
                if outcome is Outcome.HOST_DOWN:
                    self.local.forget_load(key, p.host)
                    if self.cluster.mark_down(p.host):
                        self.metrics.hosts_marked_down.inc()
                        self.metrics.hosts_up.set(len(self.cluster.eligible()))
                        log.warning("host %s marked down: %s %s", p.host, e.code().name, e.details())
                if outcome is Outcome.FINAL or attempt == self.settings.max_attempts:
                    raise err from None
                if not self.budget.withdraw():
                    self.metrics.retry_budget_exhausted.inc()
                    raise err from None
                self.metrics.retries.labels(outcome.value).inc()
                excluded.add(p.host)
                last = err
            finally:
                self.local.end(key, p.host)
        raise last or Unavailable("no host is available", retry_after_ms=500)  # unreachable: the loop raises

    def _replicate(self, tenant: str, model: str, version: str, key: str, host: str, now: float) -> None:
        """Start loading another copy of a hot model, without making any request wait for it."""
        self.local.started_load(key, host, now)
        self.metrics.replications.inc()
        req = pb.RepositoryModelLoadRequest(model_name=model)
        if version:
            req.parameters["version"].string_param = version

        async def run() -> None:
            try:
                await self.forwarder.unary(host, "RepositoryModelLoad", req.SerializeToString(), timeout=300,
                                           metadata=((TENANT_HEADER, tenant),))
            except aio.AioRpcError as e:
                self.local.forget_load(key, host)
                log.info("extra copy of %s on %s failed: %s %s", key, host, e.code().name, e.details())

        t = asyncio.get_running_loop().create_task(run())
        self._background.add(t)
        t.add_done_callback(self._background.discard)

    # -- admission ----------------------------------------------------------------------------------

    def _remaining(self, hdr: InferHeader, context: aio.ServicerContext) -> float | None:
        """Seconds left: the gRPC deadline, the `timeout` parameter (µs), else the default timeout."""
        remaining = context.time_remaining()
        if remaining is None and self.settings.default_timeout_s:
            remaining = self.settings.default_timeout_s
        us = _param_int(hdr.parameters, "timeout")
        if us is not None and us > 0:
            remaining = us / 1e6 if remaining is None else min(remaining, us / 1e6)
        return remaining

    def _admit(self, tenant: str, model: str, version: str, hdr: InferHeader, context: aio.ServicerContext) -> None:
        """Quotas, then deadline feasibility; a refusal raises (and holds no place), an admission holds one
        concurrency place until `self.admission.leave(tenant)`."""
        times = self.cluster.recent_times(model_key(tenant, model, version))
        feas = check_deadline(self._remaining(hdr, context), times, model)
        busy_ms = int(feas.expected_ms) if feas.expected_ms else 10
        d = self.admission.enter(tenant, time.monotonic(), busy_retry_ms=busy_ms)
        if not d.admit:
            raise ResourceExhausted(d.message, retry_after_ms=d.retry_after_ms, reason=d.reason.value)
        if not feas.admit:
            self.admission.leave(tenant)
            raise Unavailable(feas.message, retry_after_ms=feas.retry_after_ms, reason=ShedReason.DEADLINE_INFEASIBLE.value)
        self.metrics.admitted_inflight.inc()

    def _leave(self, tenant: str) -> None:
        self.admission.leave(tenant)
        self.metrics.admitted_inflight.dec()

    # -- inference ----------------------------------------------------------------------------------

    async def ModelInfer(self, body: bytes, context: aio.ServicerContext) -> bytes:
        ts, t0 = time.time(), time.monotonic()
        tenant = self._tenant(context)
        hdr = _parse(InferHeader, body)
        model, version = hdr.model_name, hdr.model_version
        status, host, resp, known, reason = "OK", "", b"", False, None
        try:
            if not model:
                raise InvalidArgument("model_name is required")
            await self.directory.check(tenant, model, version)
            known = True
            self._admit(tenant, model, version, hdr, context)
            try:
                resp, host = await self._forward(tenant, model, version, "ModelInfer", body, context)
            finally:
                self._leave(tenant)
            return resp
        except ServingError as e:
            status = e.code.name
            if not isinstance(e, Forwarded) and e.reason and status in SHED_CODES:
                reason = e.reason  # the router's own refusal; a hostd counts the ones it forwards
                self.metrics.shed.labels(tenant, model if known else "(unknown)", reason).inc()
            raise
        finally:
            total = time.monotonic() - t0
            served = version
            if resp:
                try:
                    served = InferHeader.FromString(resp).model_version or version
                except DecodeError:
                    pass
            self.metrics.requests.labels(tenant, model if known else "(unknown)", status).inc()
            self.metrics.forward_seconds.observe(total)
            self.access_log.write(ts=ts, tenant=tenant, model=model, version=served, host=host,
                                  total_ms=total * 1000, status=status, bytes_in=len(body), bytes_out=len(resp),
                                  id=hdr.id, reason=reason)

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
        return (await self._forward(tenant, req.name, req.version, "ModelReady", body, context, loads=False))[0]

    async def ModelMetadata(self, body: bytes, context) -> bytes:
        tenant = self._tenant(context)
        req = _parse(pb.ModelMetadataRequest, body)
        await self.directory.check(tenant, req.name, req.version)
        return (await self._forward(tenant, req.name, req.version, "ModelMetadata", body, context, loads=False))[0]

    async def ModelConfig(self, body: bytes, context) -> bytes:
        tenant = self._tenant(context)
        req = _parse(pb.ModelConfigRequest, body)
        await self.directory.check(tenant, req.name, req.version)
        return (await self._forward(tenant, req.name, req.version, "ModelConfig", body, context, loads=False))[0]

    async def RepositoryModelLoad(self, body: bytes, context) -> bytes:
        tenant = self._tenant(context)
        req = _parse(pb.RepositoryModelLoadRequest, body)
        if not req.model_name:
            raise InvalidArgument("model_name is required")
        v = req.parameters.get("version")
        version = v.string_param if v is not None and v.WhichOneof("parameter_choice") == "string_param" else ""
        await self.directory.check(tenant, req.model_name, version)
        return (await self._forward(tenant, req.model_name, version, "RepositoryModelLoad", body, context))[0]

    async def RepositoryModelUnload(self, body: bytes, context) -> bytes:
        """Unload from every host that holds the model."""
        tenant = self._tenant(context)
        req = _parse(pb.RepositoryModelUnloadRequest, body)
        if not req.model_name:
            raise InvalidArgument("model_name is required")
        await self.directory.check(tenant, req.model_name)
        key = model_key(tenant, req.model_name)
        timeout = context.time_remaining()
        calls = [self.forwarder.unary(h, "RepositoryModelUnload", body, timeout=timeout,
                                      metadata=((TENANT_HEADER, tenant),)) for h in self.cluster.holders(key)]
        for r in await asyncio.gather(*calls, return_exceptions=True):
            if isinstance(r, aio.AioRpcError) and r.code() is not grpc.StatusCode.NOT_FOUND:
                raise Forwarded(r.code(), r.details() or "", retry_after_ms(r.trailing_metadata()),
                                reason_of(r.trailing_metadata()) or "")
        return pb.RepositoryModelUnloadResponse().SerializeToString()

    async def RepositoryIndex(self, body: bytes, context) -> bytes:
        """The caller's models only, from the catalog, with their best state on any host."""
        tenant = self._tenant(context)
        req = _parse(pb.RepositoryIndexRequest, body)
        if not self.directory.enabled:
            return (await self._forward(tenant, "", "", "RepositoryIndex", body, context, loads=False))[0]
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
        """Every host's statistics for the caller's models, added up."""
        tenant = self._tenant(context)
        req = _parse(pb.ModelStatisticsRequest, body)
        if req.name:
            await self.directory.check(tenant, req.name, req.version)
        hosts = [h.address for h in self.cluster.eligible()]
        timeout = context.time_remaining() or 10.0
        results = await asyncio.gather(*(self.forwarder.unary(h, "ModelStatistics", body, timeout=timeout,
                                                              metadata=((TENANT_HEADER, tenant),)) for h in hosts),
                                       return_exceptions=True)
        merged: dict[tuple[str, str], pb.ModelStatistics] = {}
        for r in results:
            if isinstance(r, aio.AioRpcError):
                if r.code() is grpc.StatusCode.NOT_FOUND:
                    raise not_found(req.name, req.version)
                continue  # a host that cannot answer is left out
            if isinstance(r, BaseException):
                raise r
            for s in pb.ModelStatisticsResponse.FromString(r).model_stats:
                if not s.version and not s.inference_count and not s.execution_count:
                    continue  # a host that never ran the model says only its name
                k = (s.name, s.version)
                if k in merged:
                    add_stats(merged[k], s)
                else:
                    merged[k] = s
        if req.name and not merged:
            merged[(req.name, req.version)] = pb.ModelStatistics(name=req.name, version=req.version)
        return pb.ModelStatisticsResponse(model_stats=[merged[k] for k in sorted(merged)]).SerializeToString()


def _param_int(params, name: str) -> int | None:
    """Malformed parameters are left for the hostd to refuse with INVALID_ARGUMENT."""
    try:
        return param_int(params, name)
    except ValueError:
        return None


def _add_durations(dst, src) -> None:
    for f in dst.DESCRIPTOR.fields:
        if f.message_type is not None and f.message_type.name == "StatisticDuration":
            d, s = getattr(dst, f.name), getattr(src, f.name)
            d.count += s.count
            d.ns += s.ns


def add_stats(dst: pb.ModelStatistics, src: pb.ModelStatistics) -> None:
    dst.last_inference = max(dst.last_inference, src.last_inference)
    dst.inference_count += src.inference_count
    dst.execution_count += src.execution_count
    _add_durations(dst.inference_stats, src.inference_stats)
    by_size = {b.batch_size: b for b in dst.batch_stats}
    for b in src.batch_stats:
        if b.batch_size in by_size:
            _add_durations(by_size[b.batch_size], b)
        else:
            dst.batch_stats.add().CopyFrom(b)
