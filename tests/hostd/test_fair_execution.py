"""Batchers of several tenants sharing the host's execution slots (asyncio, a stand-in model that records
the order it ran batches in; ordering is asserted, never timing)."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from hostd.batch_policy import BatchConfig
from hostd.batcher import ModelRunner, QueueLimits
from hostd.execution import ExecutionGate
from hostd.metrics import HostdMetrics
from hostd.runtimes.base import LoadedModel
from hostd.stats import ModelStats
from hostd.tensors import DecodedRequest


class Recorder(LoadedModel):
    """Identity model that logs which tenant's batch ran, holding the slot until released by the test."""

    def __init__(self, tenant: str, log: list[str], gate_evt: threading.Event) -> None:
        self.tenant, self.log, self.evt = tenant, log, gate_evt

    def run(self, inputs, outputs):
        self.evt.wait(5)
        self.log.append(self.tenant)
        return {"y": inputs["x"]}

    def close(self) -> None:
        pass


def req(v: float) -> DecodedRequest:
    x = np.full((1, 2), v, np.float32)
    return DecodedRequest(inputs={"x": x}, outputs=["y"], raw=True, rows=1, shape_key=(), nbytes=8)


def runner(tenant: str, model, gate, pool, metrics, instances=1, mbs=0) -> ModelRunner:
    return ModelRunner(tenant=tenant, model=f"{tenant}-m", loaded=model, config=BatchConfig(max_batch_size=mbs),
                       limits=QueueLimits(max_queue_size=1000), instances=instances, pool=pool, stats=ModelStats(),
                       metrics=metrics, gate=gate)


async def scenario(weights: dict[str, float]):
    log: list[str] = []
    evt = threading.Event()
    metrics = HostdMetrics()
    gate = ExecutionGate(1, lambda t: weights.get(t, 1.0))
    with ThreadPoolExecutor(8) as pool:
        noisy = runner("noisy", Recorder("noisy", log, evt), gate, pool, metrics, instances=4)
        quiet = runner("quiet", Recorder("quiet", log, evt), gate, pool, metrics)
        noisy_calls = [asyncio.ensure_future(noisy.infer(req(i))) for i in range(30)]
        await asyncio.sleep(0.01)
        quiet_calls = [asyncio.ensure_future(quiet.infer(req(100 + i))) for i in range(3)]
        await asyncio.sleep(0.01)
        evt.set()
        outs = await asyncio.gather(*noisy_calls, *quiet_calls)
    return log, outs


def test_quiet_tenant_is_not_starved_by_a_flood():
    log, outs = asyncio.run(scenario({}))
    assert [float(o["y"][0, 0]) for o in outs] == [float(i) for i in range(30)] + [100.0, 101.0, 102.0]
    # one slot, equal weights: quiet's three batches interleave with noisy's instead of waiting for all 30
    last_quiet = max(i for i, t in enumerate(log) if t == "quiet")
    assert last_quiet <= 7, log


def test_weights_favour_the_heavier_tenant():
    log, _ = asyncio.run(scenario({"quiet": 0.2}))
    first_quiet_batches = [i for i, t in enumerate(log) if t == "quiet"]
    log_eq, _ = asyncio.run(scenario({}))
    eq = [i for i, t in enumerate(log_eq) if t == "quiet"]
    assert first_quiet_batches[-1] > eq[-1]  # a lighter weight waits longer behind the flood
