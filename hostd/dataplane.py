"""hostd's data plane: what the v2 inference service does, with no gRPC in it (KServe's DataPlane).

The gRPC servicer (hostd/servicer.py) reads the tenant and the call's remaining time off the context,
calls one method here, and turns the result into a response message. Everything with a rule in it lives
here: draining and in-flight accounting, the deadline, request priority, request and shed counting, per-
model statistics, model readiness. Errors are raised as ServingError (ground/errors.py); one interceptor
turns them into statuses.

Bytes in flight are bounded per tenant and for the host (ground/inflight_policy.py, sized by the settings
`inflight_bytes` / `tenant_inflight_bytes`): each request's size is charged when DataPlane.infer starts and
given back when it ends; past the budget the request is RESOURCE_EXHAUSTED `inflight_bytes` with
retry-after-ms before it is decoded, queued or batched, so one tenant's storm of large requests holds at most
its share of this host's memory.

The clock is injected: `clock` (monotonic seconds) for deadlines, durations, rates and load backoffs, the
same clock the manager uses; `wall` (Unix seconds) only for Triton's `last_inference` timestamp. Tests
drive it with a fake manager and a fake clock (tests/hostd/test_dataplane.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ground.deadlines import deadline_at
from ground.served import Served
from ground.errors import InvalidArgument, NotFound, ResourceExhausted, ServingError, Unavailable
from ground.interceptors import WIRE_BYTES
from ground.inflight_policy import InflightBytes, budget_of
from ground.manifest import ModelManifest
from ground.params import param_int
from ground.wire import Reason
from hostd.metrics import HostdMetrics
from hostd.model_state import ModelState
from hostd.stats import ModelStats
from hostd.tensors import decode_request, encode_response
from protos import grpc_service_pb2 as pb

if TYPE_CHECKING:
    from hostd.manager import ModelManager

DRAIN_RETRY_AFTER_MS = 50  # a draining host's refusal: the router retries elsewhere at once
UNKNOWN_MODEL = "(unknown)"  # the metrics label for names that resolved to nothing (never a label value)
_SHED_CODES = frozenset({"RESOURCE_EXHAUSTED", "UNAVAILABLE", "DEADLINE_EXCEEDED"})


# ---- rules (pure) ---------------------------------------------------------------------------------------
def request_bytes(request: pb.ModelInferRequest) -> int:
    """What a request holds in memory, near enough to charge it: its raw tensor bytes, plus 8 bytes per typed
    element (the widest type) and the bytes of BYTES elements. No serialization (ByteSize would copy it)."""
    n = sum(len(r) for r in request.raw_input_contents)
    for t in request.inputs:
        c = t.contents
        n += 8 * (len(c.bool_contents) + len(c.int_contents) + len(c.int64_contents) + len(c.uint_contents)
                  + len(c.uint64_contents) + len(c.fp32_contents) + len(c.fp64_contents))
        n += sum(len(b) for b in c.bytes_contents)
    return n


def int_param(params, name: str) -> int | None:
    """An integer request parameter; InvalidArgument (naming it) when it is not one."""
    try:
        return param_int(params, name)
    except ValueError as e:
        raise InvalidArgument(str(e)) from None


def request_priority(requested: int, m: ModelManifest, tenant_default: int = 0) -> int:
    """v2 / Triton semantics: 1 is the highest priority; 0 (or absent) is the tenant's default level when
    the model has that level, else the model's default level."""
    p = requested
    b = m.batching
    levels = b.priority_levels
    if p == 0 and tenant_default and (not levels or tenant_default <= levels):
        p = tenant_default
    if p < 0 or (levels and p > levels):
        raise InvalidArgument(f"priority {p} is outside the model's levels 1..{levels or 'N'} (0 = default)")
    return p or (b.default_priority_level or max(levels, 1))


def infer_deadline(now: float, grpc_remaining: float | None, params) -> float:
    """The call's absolute deadline: its gRPC deadline and its `timeout` parameter (microseconds), whichever
    is earlier (ground/deadlines.py, the rule the router uses too). hostd sets no default of its own."""
    return deadline_at(now, grpc_remaining, int_param(params, "timeout"))


def model_is_ready(state: ModelState, retry_at: float, now: float) -> bool:
    """Ready means a request would be served: READY, or loadable on demand (lazy loading is transparent).
    A model in its FAILED backoff is not ready."""
    return state is ModelState.READY or state is not ModelState.FAILED or retry_at <= now


# ---- what the data plane answers (the servicer turns these into messages) --------------------------------
@dataclass(frozen=True, slots=True)
class ModelInfo:
    manifest: ModelManifest
    versions: list[str]


@dataclass(frozen=True, slots=True)
class IndexRow:
    name: str
    version: str
    state: ModelState
    reason: str


@dataclass(frozen=True, slots=True)
class StatsRow:
    name: str
    version: str
    stats: ModelStats | None  # None: a known model no request has reached yet (an empty entry)


class DataPlane:
    def __init__(self, manager: ModelManager, metrics: HostdMetrics, *,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
                 inflight: InflightBytes | None = None) -> None:
        """`inflight`: the byte budget (default: from the manager's settings)."""
        self.manager = manager
        s = manager.settings
        self.inflight_bytes = inflight or InflightBytes(budget_of(s.inflight_bytes, s.tenant_inflight_bytes,
                                                                  s.memory_limit))
        self.metrics = metrics
        self._clock = clock
        self._wall = wall
        self.draining = False  # set by the server on SIGTERM: new inference requests are refused
        self.started = False  # set by the server once preloading (if any) is done
        self.inflight = 0
        self.requests_by_tenant: dict[str, int] = {}
        self.shed_by_tenant: dict[str, int] = {}
        self._quiet = asyncio.Event()
        self._quiet.set()

    # ---- server ---------------------------------------------------------------------------------------
    def ready(self) -> bool:
        return self.started and not self.draining

    async def wait_quiet(self, timeout_s: float) -> bool:
        """Wait until no inference request is in flight; False if the timeout passed first."""
        try:
            await asyncio.wait_for(self._quiet.wait(), timeout_s)
            return True
        except asyncio.TimeoutError:
            return False

    # ---- inference ------------------------------------------------------------------------------------
    async def infer(self, tenant: str, request: pb.ModelInferRequest,
                    remaining: float | None = None, served: Served | None = None,
                    raw: Sequence[memoryview] | None = None) -> pb.ModelInferResponse:
        """One inference call. `remaining`: seconds left on the call's gRPC deadline (None for none).
        `raw`: the raw input values, when they were split out of the request (hostd/wire_request.py).
        `served`, when given, is filled in as the call goes: the version and its size once resolved, the
        seconds waited for a load, queued and computing (the `mmhost-served` trailer)."""
        self.inflight += 1
        self._quiet.clear()
        try:
            return await self._infer(tenant, request, remaining, served, raw)
        finally:
            self.inflight -= 1
            if self.inflight == 0:
                self._quiet.set()

    async def _infer(self, tenant: str, request: pb.ModelInferRequest, remaining: float | None,
                     served: Served | None, raw: Sequence[memoryview] | None):
        t0 = self._clock()
        model = request.model_name
        e = None
        charged = 0
        try:
            if self.draining:
                raise Unavailable("server is draining; retry on another host", reason=Reason.DRAINING.value,
                                  retry_after_ms=DRAIN_RETRY_AFTER_MS)
            # raw tensors: the size on the wire is their size (walking them would copy each); typed contents
            # take more room decoded than on the wire: counted element by element
            n = (WIRE_BYTES.get() if raw or len(request.raw_input_contents) else 0) or request_bytes(request)
            grant = self.inflight_bytes.acquire(tenant, n)
            if not grant.granted:
                raise ResourceExhausted(grant.message, retry_after_ms=grant.retry_after_ms,
                                        reason=Reason.INFLIGHT_BYTES.value)
            charged = n
            if not model:
                raise InvalidArgument("model_name is required")
            e = await self.manager.resolve(tenant, model, request.model_version or None)
            m = e.manifest
            if served is not None:
                served.version, served.size_bytes = m.version, m.total_bytes
            deadline = infer_deadline(t0, remaining, request.parameters)
            decoded = decode_request(request, m, self.manager.settings.max_request_bytes, raw)
            t_ready = self._clock()
            runner = await self.manager.ready_runner(e, deadline)
            if served is not None:
                served.load_s = self._clock() - t_ready
            priority = request_priority(int_param(request.parameters, "priority") or 0, m,
                                        self.manager.tenants.get(tenant).default_priority)
            outputs = await runner.infer(decoded, priority, deadline, served)
            resp = encode_response(request, m, outputs, decoded.outputs, decoded.raw)
        except ServingError as err:
            self._count(tenant, model, err.code.name, t0, e, err)
            raise
        finally:
            if charged:
                self.inflight_bytes.release(tenant, charged)
        self._count(tenant, model, "OK", t0, e)
        return resp

    def _count(self, tenant: str, model: str, status: str, t0: float, e=None, err: ServingError | None = None) -> None:
        now = self._clock()
        label_model = model if e is not None else UNKNOWN_MODEL
        requests, duration = self.metrics.request_series(tenant, label_model, status)
        requests.inc()
        self.requests_by_tenant[tenant] = self.requests_by_tenant.get(tenant, 0) + 1
        duration.observe(now - t0)
        if e is not None:
            e.stats.rate.hit(now)
            if status == "OK":
                e.stats.success.add(int((now - t0) * 1e9))
                e.stats.last_inference_ms = int(self._wall() * 1000)
            else:
                e.stats.fail.add(int((now - t0) * 1e9))
        if err is not None and status in _SHED_CODES and err.reason:
            self.metrics.shed.labels(tenant, label_model, err.reason).inc()
            self.shed_by_tenant[tenant] = self.shed_by_tenant.get(tenant, 0) + 1
            if e is not None:
                e.stats.shed += 1

    # ---- models ---------------------------------------------------------------------------------------
    async def model_ready(self, tenant: str, name: str, version: str | None = None) -> bool:
        try:
            e = await self.manager.resolve(tenant, name, version or None)
        except NotFound:
            return False
        return model_is_ready(e.state, e.retry_at, self._clock()) and self.ready()

    async def model_metadata(self, tenant: str, name: str, version: str | None = None) -> ModelInfo:
        e = await self.manager.resolve(tenant, name, version or None)
        return ModelInfo(e.manifest, await self.manager.versions(tenant, e.manifest.model))

    async def model_manifest(self, tenant: str, name: str, version: str | None = None) -> ModelManifest:
        return (await self.manager.resolve(tenant, name, version or None)).manifest

    async def statistics(self, tenant: str, name: str = "", version: str = "") -> list[StatsRow]:
        """The tenant's model versions on this host, filtered by name and version ("" = all). A named model
        with no entry yet answers one empty row (NotFound when the catalog does not know it)."""
        rows = [StatsRow(m, v, e.stats) for (t, m, v), e in sorted(self.manager.entries.items())
                if t == tenant and (not name or m == name) and (not version or v == version)]
        if name and not rows:
            await self.manager.resolve(tenant, name, version or None)  # NotFound if unknown
            return [StatsRow(name, version, None)]
        return rows

    async def repository_index(self, tenant: str, ready_only: bool = False) -> list[IndexRow]:
        rows = []
        for name, versions in await self.manager.catalog_models(tenant):
            for v in versions:
                e = self.manager.entries.get((tenant, name, v))
                state = e.state if e is not None else ModelState.ABSENT
                if ready_only and state is not ModelState.READY:
                    continue
                rows.append(IndexRow(name, v, state, e.error if e is not None else ""))
        return rows

    async def load(self, tenant: str, model: str, version: str | None = None, pin: bool | None = None) -> None:
        if not model:
            raise InvalidArgument("model_name is required")
        await self.manager.load(tenant, model, version, pin=pin)

    async def unload(self, tenant: str, model: str) -> None:
        if not model:
            raise InvalidArgument("model_name is required")
        await self.manager.unload_model(tenant, model)
