"""hostd's data plane without gRPC or processes: a fake manager, a fake runner and a fake clock drive the
rules (drain refusal, deadline, priority, readiness, counting) that the servicer only converts."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import numpy as np
import pytest

from ground.served import Served
from ground.errors import InvalidArgument, NotFound, ResourceExhausted, Unavailable
from ground.manifest import DynamicBatching, ModelFormat, ModelManifest, TensorSpec
from ground.tenancy import TenantLimits
from ground.wire import Reason
from ground.inflight_policy import ByteBudget, InflightBytes
from hostd.dataplane import (DataPlane, IndexRow, StatsRow, infer_deadline, model_is_ready, request_bytes,
                             request_priority)
from hostd.metrics import HostdMetrics
from hostd.model_state import ModelState
from hostd.stats import ModelStats
from hostd.tenants import TenantLimitsView
from protos import grpc_service_pb2 as pb

INF = float("inf")

M = ModelManifest(
    tenant="t", model="m", version="1", format=ModelFormat.ONNX, model_file="model.onnx", max_batch_size=4,
    inputs=[TensorSpec(name="x", datatype="FP32", shape=[-1, 2])],
    outputs=[TensorSpec(name="y", datatype="FP32", shape=[-1, 2])],
    dynamic_batching=DynamicBatching(priority_levels=3, default_priority_level=2),
)


class Clock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@dataclass
class Entry:
    manifest: ModelManifest
    stats: ModelStats = field(default_factory=ModelStats)
    state: ModelState = ModelState.ABSENT
    error: str = ""
    retry_at: float = 0.0


class Runner:
    """Answers y = 2x, after advancing the fake clock by `takes` seconds; remembers what it was asked."""

    def __init__(self, clock: Clock, takes: float = 0.25, fail: Exception | None = None) -> None:
        self.clock, self.takes, self.fail = clock, takes, fail
        self.calls: list[tuple[int, float]] = []

    async def infer(self, decoded, priority: int, deadline: float, served=None):
        self.calls.append((priority, deadline))
        self.clock.now += self.takes
        if served is not None:  # as the batcher does: all of it computing, none queued
            served.queue_s, served.compute_s = 0.0, self.takes
        if self.fail is not None:
            raise self.fail
        return {"y": decoded.inputs["x"] * 2}


@dataclass
class Settings:
    max_request_bytes: int = 1 << 20
    inflight_bytes: str = "512MiB"
    tenant_inflight_bytes: str = ""
    memory_limit: str = ""


class Manager:
    def __init__(self, runner: Runner, limits: dict[str, TenantLimits] | None = None) -> None:
        self.runner = runner
        self.settings = Settings()
        self.tenants = TenantLimitsView(limits)
        self.entries: dict[tuple[str, str, str], Entry] = {}
        self.ready_deadlines: list[float] = []
        self.loads: list[tuple] = []
        self.load_s = 0.0  # each ready_runner waits this long (a load)

    async def resolve(self, tenant: str, model: str, version: str | None) -> Entry:
        if tenant != "t" or model != "m" or version not in (None, "1"):
            raise NotFound(f"model {model!r} not found")
        return self.entries.setdefault((tenant, model, "1"), Entry(M))

    async def ready_runner(self, e: Entry, deadline: float) -> Runner:
        self.ready_deadlines.append(deadline)
        self.runner.clock.now += self.load_s
        return self.runner

    async def versions(self, tenant: str, model: str) -> list[str]:
        return ["1"]

    async def catalog_models(self, tenant: str) -> list[tuple[str, list[str]]]:
        return [("m", ["1"]), ("other", ["1", "2"])]

    async def load(self, tenant, model, version, pin=None):
        self.loads.append(("load", tenant, model, version, pin))

    async def unload_model(self, tenant, model):
        self.loads.append(("unload", tenant, model))


def plane(takes: float = 0.25, fail: Exception | None = None, limits=None) -> tuple[DataPlane, Manager, Clock]:
    clock = Clock()
    mgr = Manager(Runner(clock, takes, fail), limits)
    return DataPlane(mgr, HostdMetrics(), clock=clock, wall=lambda: 1_700_000_000.0), mgr, clock


def infer_req(model: str = "m", priority: int | str | None = None, timeout_us: int | None = None) -> pb.ModelInferRequest:
    r = pb.ModelInferRequest(model_name=model, id="r1")
    r.inputs.add(name="x", datatype="FP32", shape=[1, 2])
    r.raw_input_contents.append(np.array([[1, 2]], np.float32).tobytes())
    if isinstance(priority, int):
        r.parameters["priority"].int64_param = priority
    elif isinstance(priority, str):
        r.parameters["priority"].string_param = priority
    if timeout_us is not None:
        r.parameters["timeout"].int64_param = timeout_us
    return r


def metric(dp: DataPlane, name: str, **labels) -> float:
    return dp.metrics.registry.get_sample_value(name, labels) or 0.0


# ---- rules ----------------------------------------------------------------------------------------------
def test_priority_rules():
    assert request_priority(0, M) == 2  # the model's default level
    assert request_priority(1, M) == 1
    assert request_priority(0, M, tenant_default=3) == 3  # the tenant's default, when the model has it
    assert request_priority(0, M, tenant_default=5) == 2  # ...else the model's
    assert request_priority(2, M, tenant_default=3) == 2  # an explicit level wins over the tenant's
    for bad in (-1, 4):
        with pytest.raises(InvalidArgument, match=rf"priority {bad} is outside the model's levels 1..3"):
            request_priority(bad, M)
    flat = M.model_copy(update={"dynamic_batching": None})
    assert request_priority(0, flat) == 1 and request_priority(7, flat) == 7  # no levels: anything >= 1


def test_deadline_is_the_earlier_of_grpc_and_timeout_parameter():
    r = infer_req(timeout_us=500_000)
    assert infer_deadline(100.0, 2.0, r.parameters) == 100.5
    assert infer_deadline(100.0, 0.1, r.parameters) == 100.1
    assert infer_deadline(100.0, None, r.parameters) == 100.5
    assert infer_deadline(100.0, None, infer_req().parameters) == INF  # hostd has no default of its own
    assert infer_deadline(100.0, None, infer_req(timeout_us=0).parameters) == INF
    r.parameters["timeout"].string_param = "soon"
    with pytest.raises(InvalidArgument, match="parameter 'timeout' must be an integer"):
        infer_deadline(100.0, None, r.parameters)


def test_model_readiness():
    assert model_is_ready(ModelState.READY, 0.0, 100.0)
    assert model_is_ready(ModelState.ABSENT, 0.0, 100.0)  # loadable on demand
    assert not model_is_ready(ModelState.FAILED, 130.0, 100.0)  # in its backoff
    assert model_is_ready(ModelState.FAILED, 90.0, 100.0)  # backoff over: a request retries the load


# ---- inference ------------------------------------------------------------------------------------------
def test_infer_passes_deadline_and_priority_and_counts():
    dp, mgr, clock = plane(limits={"t": TenantLimits(default_priority=3)})
    resp = asyncio.run(dp.infer("t", infer_req(timeout_us=2_000_000), remaining=5.0))
    assert resp.id == "r1" and resp.model_version == "1"
    assert np.frombuffer(resp.raw_output_contents[0], np.float32).tolist() == [2.0, 4.0]
    assert mgr.ready_deadlines == [102.0]
    assert mgr.runner.calls == [(3, 102.0)]  # the tenant's default level
    st = mgr.entries[("t", "m", "1")].stats
    assert st.success.count == 1 and st.success.ns == 250_000_000 and st.fail.count == 0
    assert st.last_inference_ms == 1_700_000_000_000
    assert dp.requests_by_tenant == {"t": 1} and dp.shed_by_tenant == {} and dp.inflight == 0
    assert metric(dp, "mmhost_requests_total", tenant="t", model="m", status="OK") == 1


def test_priority_parameter_reaches_the_runner_and_bad_ones_are_refused():
    dp, mgr, _ = plane()
    asyncio.run(dp.infer("t", infer_req(priority=1)))
    asyncio.run(dp.infer("t", infer_req()))
    assert [p for p, _ in mgr.runner.calls] == [1, 2]
    with pytest.raises(InvalidArgument, match="parameter 'priority' must be an integer"):
        asyncio.run(dp.infer("t", infer_req(priority="high")))
    with pytest.raises(InvalidArgument, match="outside the model's levels"):
        asyncio.run(dp.infer("t", infer_req(priority=9)))
    assert len(mgr.runner.calls) == 2  # refused ones never ran
    assert mgr.entries[("t", "m", "1")].stats.fail.count == 2


def test_draining_refuses_with_reason_and_retry_after():
    dp, mgr, _ = plane()
    dp.started = True
    assert dp.ready()
    dp.draining = True
    assert not dp.ready()
    with pytest.raises(Unavailable) as ei:
        asyncio.run(dp.infer("t", infer_req()))
    err = ei.value
    assert err.reason == Reason.DRAINING.value and err.retry_after_ms == 50 and "draining" in err.message
    assert mgr.runner.calls == [] and mgr.entries == {}  # refused before resolving the model
    assert dp.shed_by_tenant == {"t": 1} and dp.requests_by_tenant == {"t": 1} and dp.inflight == 0
    assert metric(dp, "mmhost_requests_shed_total", tenant="t", model="(unknown)", reason="draining") == 1


def test_bytes_in_flight_past_the_tenants_budget_are_refused_before_anything_else_and_given_back():
    dp, mgr, _ = plane()
    dp.inflight_bytes = InflightBytes(ByteBudget(total=1000, per_tenant=100))
    assert request_bytes(infer_req()) == 8  # two float32
    assert dp.inflight_bytes.acquire("t", 95).granted  # another request of t's, still running
    with pytest.raises(ResourceExhausted) as ei:
        asyncio.run(dp.infer("t", infer_req()))
    assert ei.value.reason == Reason.INFLIGHT_BYTES.value and ei.value.retry_after_ms is not None
    assert mgr.runner.calls == [] and dp.inflight_bytes.of("t") == 95  # refused before the model; nothing held
    assert metric(dp, "mmhost_requests_shed_total", tenant="t", model="(unknown)", reason="inflight_bytes") == 1
    dp.inflight_bytes.release("t", 95)
    asyncio.run(dp.infer("t", infer_req()))
    assert dp.inflight_bytes.total == 0  # the request's bytes were given back when it ended


def test_runner_sheds_are_counted_on_the_model():
    dp, mgr, _ = plane(fail=ResourceExhausted("queue full", reason=Reason.QUEUE_FULL.value, retry_after_ms=10))
    with pytest.raises(ResourceExhausted):
        asyncio.run(dp.infer("t", infer_req()))
    st = mgr.entries[("t", "m", "1")].stats
    assert st.shed == 1 and st.fail.count == 1 and dp.shed_by_tenant == {"t": 1}
    assert metric(dp, "mmhost_requests_shed_total", tenant="t", model="m", reason="queue_full") == 1


def test_unknown_models_are_counted_under_one_label():
    dp, _, _ = plane()
    with pytest.raises(NotFound):
        asyncio.run(dp.infer("t", infer_req(model="nope")))
    with pytest.raises(InvalidArgument, match="model_name is required"):
        asyncio.run(dp.infer("t", infer_req(model="")))
    assert metric(dp, "mmhost_requests_total", tenant="t", model="(unknown)", status="NOT_FOUND") == 1
    assert metric(dp, "mmhost_requests_total", tenant="t", model="(unknown)", status="INVALID_ARGUMENT") == 1
    assert dp.shed_by_tenant == {}


def test_wait_quiet_tracks_requests_in_flight():
    async def scenario():
        dp, mgr, _ = plane()
        gate = asyncio.Event()
        real = mgr.runner.infer

        async def held(decoded, priority, deadline, served=None):
            await gate.wait()
            return await real(decoded, priority, deadline)

        mgr.runner.infer = held
        call = asyncio.ensure_future(dp.infer("t", infer_req()))
        await asyncio.sleep(0)
        assert dp.inflight == 1
        assert not await dp.wait_quiet(0.01)
        gate.set()
        assert await dp.wait_quiet(1.0)
        await call
        return dp.inflight

    assert asyncio.run(scenario()) == 0


# ---- models and repository ------------------------------------------------------------------------------
def test_model_ready_follows_state_backoff_and_server():
    async def scenario():
        dp, mgr, clock = plane()
        seen = [await dp.model_ready("t", "m")]  # not started yet
        dp.started = True
        seen.append(await dp.model_ready("t", "m"))
        e = mgr.entries[("t", "m", "1")]
        e.state, e.retry_at = ModelState.FAILED, clock.now + 5
        seen.append(await dp.model_ready("t", "m"))
        clock.now += 6
        seen.append(await dp.model_ready("t", "m"))
        seen.append(await dp.model_ready("t", "nope"))
        return seen

    assert asyncio.run(scenario()) == [False, True, False, True, False]


def test_metadata_statistics_index_and_load():
    async def scenario():
        dp, mgr, _ = plane()
        assert await dp.statistics("t") == []
        # known to the catalog but no entry on this host yet: one empty row (the manager makes the entry)
        assert await dp.statistics("t", "m") == [StatsRow("m", "", None)]
        with pytest.raises(NotFound):
            await dp.statistics("t", "nope")
        info = await dp.model_metadata("t", "m")
        assert info.manifest is M and info.versions == ["1"]
        assert (await dp.model_manifest("t", "m", "1")) is M
        with pytest.raises(NotFound):
            await dp.model_metadata("other-tenant", "m")
        await dp.infer("t", infer_req())
        rows = await dp.statistics("t", "m")
        assert [(r.name, r.version, r.stats.success.count) for r in rows] == [("m", "1", 1)]
        with pytest.raises(NotFound):
            await dp.statistics("t", "m", "2")  # a version the catalog does not have
        e = mgr.entries[("t", "m", "1")]
        e.state, e.error = ModelState.READY, ""
        assert await dp.repository_index("t") == [
            IndexRow("m", "1", ModelState.READY, ""), IndexRow("other", "1", ModelState.ABSENT, ""),
            IndexRow("other", "2", ModelState.ABSENT, "")]
        assert await dp.repository_index("t", ready_only=True) == [IndexRow("m", "1", ModelState.READY, "")]
        await dp.load("t", "m", "1", pin=True)
        await dp.unload("t", "m")
        for call in (dp.load("t", ""), dp.unload("t", "")):
            with pytest.raises(InvalidArgument, match="model_name is required"):
                await call
        return mgr.loads

    assert asyncio.run(scenario()) == [("load", "t", "m", "1", True), ("unload", "t", "m")]


def test_served_tells_the_version_its_size_and_where_the_time_went():
    p, mgr, _ = plane(takes=0.25)
    mgr.load_s = 1.5
    served = Served()
    asyncio.run(p.infer("t", infer_req(), None, served))
    assert (served.version, served.size_bytes) == ("1", M.total_bytes)
    assert (served.load_s, served.queue_s, served.compute_s) == (1.5, 0.0, 0.25)
    refused = Served()
    with pytest.raises(InvalidArgument):  # refused after the version was resolved: still says which
        asyncio.run(p.infer("t", pb.ModelInferRequest(model_name="m", id="bad"), None, refused))
    assert refused.version == "1"


class _Context:
    def __init__(self) -> None:
        self.trailing: tuple = ()

    def invocation_metadata(self):
        return (("mmhost-tenant", "t"),)

    def time_remaining(self):
        return None

    def set_trailing_metadata(self, md) -> None:
        self.trailing = tuple(md)


def test_the_servicer_answers_with_mmhost_served_once_even_for_an_error_shared_by_a_batch():
    from hostd.servicer import InferenceServicer
    from ground.wire import SERVED

    shared = Unavailable("model failed", reason="model_failed")  # one error object fails every request of a batch
    p, _, _ = plane(fail=shared)
    servicer = InferenceServicer(None, HostdMetrics(), None, plane=p)  # type: ignore[arg-type]
    for _ in range(2):
        with pytest.raises(Unavailable) as e:
            asyncio.run(servicer.ModelInfer(infer_req(), _Context()))
        assert [v for k, v in e.value.trailers if k == SERVED] == [Served("1", M.total_bytes, 0.0, 0.0, 0.25).encode()]
    ctx = _Context()
    ok_plane, _, _ = plane()
    asyncio.run(InferenceServicer(None, HostdMetrics(), None, plane=ok_plane).ModelInfer(infer_req(), ctx))  # type: ignore[arg-type]
    assert Served.decode(dict(ctx.trailing)[SERVED]) == Served("1", M.total_bytes, 0.0, 0.0, 0.25)
