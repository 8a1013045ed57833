"""Priorities and deadlines on a busy model: priority 1 overtakes queued default requests, and a request
whose deadline passes while it waits is answered DEADLINE_EXCEEDED and never executes."""

from __future__ import annotations

import asyncio

import grpc
import numpy as np

from protos import grpc_service_pb2 as pb
from protos import grpc_service_pb2_grpc, hostd_control_pb2, hostd_control_pb2_grpc


def _req(i: int, rows: int = 32, priority: int = 0, timeout_us: int = 0) -> pb.ModelInferRequest:
    r = pb.ModelInferRequest(model_name="mlp_prio", id=str(i))
    r.inputs.add(name="input", datatype="FP32", shape=[rows, 64])
    r.raw_input_contents.append(np.full((rows, 64), i, np.float32).tobytes())
    if priority:
        r.parameters["priority"].int64_param = priority
    if timeout_us:
        r.parameters["timeout"].int64_param = timeout_us
    return r


async def _queued(ctl, at_least: int) -> int:
    """Wait until `at_least` requests wait in the model's queue; returns the queue depth seen."""
    for _ in range(2000):
        st = await ctl.Status(hostd_control_pb2.StatusRequest())
        for m in st.models:
            if m.model == "mlp_prio" and m.queue_depth >= at_least:
                return m.queue_depth
        await asyncio.sleep(0.002)
    raise AssertionError("the model's queue never filled")


DEFAULTS = 60


async def _priority_scenario(addr: str) -> tuple[list[str], int]:
    done: list[str] = []
    async with grpc.aio.insecure_channel(addr) as ch:
        stub = grpc_service_pb2_grpc.GRPCInferenceServiceStub(ch)
        ctl = hostd_control_pb2_grpc.HostdControlStub(ch)
        await stub.ModelInfer(_req(0))  # loaded

        async def call(r):
            resp = await stub.ModelInfer(r)
            done.append(resp.id)

        # 60 batches of ~1-4 ms each on the model's one slot: sent much faster than they drain, so the queue
        # fills past 8 whatever the machine's load (with 20 it sometimes drained before the poll saw 8)
        defaults = [asyncio.ensure_future(call(_req(i))) for i in range(1, DEFAULTS + 1)]
        waiting = await _queued(ctl, 8)
        urgent = asyncio.ensure_future(call(_req(99, priority=1)))
        await asyncio.gather(*defaults, urgent)
    return done, waiting


def test_priority_one_overtakes_queued_default_requests(hostd):
    done, waiting = asyncio.run(_priority_scenario(hostd.addr))
    assert len(done) == DEFAULTS + 1
    # `waiting` (>= 8) default requests were queued just before it was sent; it overtakes them all except
    # the few that start while it is on the wire (first in, first out would put it last)
    overtaken = len(done) - 1 - done.index("99")
    assert overtaken >= waiting - 3, (waiting, done)


async def _deadline_scenario(addr: str):
    async with grpc.aio.insecure_channel(addr) as ch:
        stub = grpc_service_pb2_grpc.GRPCInferenceServiceStub(ch)
        ctl = hostd_control_pb2_grpc.HostdControlStub(ch)
        await stub.ModelInfer(_req(0))
        before = (await stub.ModelStatistics(pb.ModelStatisticsRequest(name="mlp_prio"))).model_stats[0]
        busy = [asyncio.ensure_future(stub.ModelInfer(_req(i))) for i in range(1, 13)]
        await _queued(ctl, 4)
        # 3 rows each, 1 ms to live: they expire in the queue behind the busy work
        doomed = [asyncio.ensure_future(stub.ModelInfer(_req(100 + i, rows=3, timeout_us=1000))) for i in range(5)]
        ok = await asyncio.gather(*busy)
        late = await asyncio.gather(*doomed, return_exceptions=True)
        after = (await stub.ModelStatistics(pb.ModelStatisticsRequest(name="mlp_prio"))).model_stats[0]
    return ok, late, before, after


def test_expired_requests_never_execute(hostd):
    ok, late, before, after = asyncio.run(_deadline_scenario(hostd.addr))
    assert len(ok) == 12
    for e in late:
        assert isinstance(e, grpc.aio.AioRpcError) and e.code() == grpc.StatusCode.DEADLINE_EXCEEDED, e
    # only the 12 live requests' rows (32 each) were computed; none of the expired 3-row requests
    assert after.inference_count - before.inference_count == 12 * 32
    text = hostd.metrics_text()
    assert 'reason="deadline"' in text and "mmhost_requests_shed_total" in text
