"""A model whose batches take microseconds runs them on the event loop thread once measured (no worker
thread hop, no GIL hand-off behind a busy loop); a slow one, a GPU one, or an unmeasured one never does."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from hostd.batch_policy import BatchConfig
from hostd.batcher import INLINE_AFTER, ModelRunner, QueueLimits
from hostd.execution import ExecutionGate
from hostd.metrics import HostdMetrics
from hostd.runtimes.base import DeviceSpec, LoadedModel
from hostd.stats import ModelStats
from hostd.tensors import DecodedRequest


class Where(LoadedModel):
    def __init__(self, kind: str = "cpu", seconds: float = 0.0) -> None:
        self.device = DeviceSpec(kind=kind)
        self.seconds = seconds
        self.threads: list[int] = []

    def run(self, inputs, outputs):
        self.threads.append(threading.get_ident())
        if self.seconds:
            time.sleep(self.seconds)
        return {"y": inputs["x"]}

    def close(self) -> None:
        pass


def _req(v: float) -> DecodedRequest:
    return DecodedRequest(inputs={"x": np.full((1, 2), v, np.float32)}, outputs=["y"], raw=True, rows=1,
                          shape_key=(), nbytes=8)


async def _serve(model: Where, n: int) -> list[float]:
    with ThreadPoolExecutor(2) as pool:
        r = ModelRunner(tenant="t", model="m", loaded=model, config=BatchConfig(max_batch_size=4),
                        limits=QueueLimits(max_queue_size=100), instances=1, pool=pool, stats=ModelStats(),
                        metrics=HostdMetrics(), gate=ExecutionGate(2))
        out = []
        for i in range(n):
            out.append(float((await r.infer(_req(i)))["y"][0, 0]))
        out += [float(o["y"][0, 0]) for o in await asyncio.gather(*(r.infer(_req(100 + i)) for i in range(6)))]
        return out


def test_a_fast_cpu_model_runs_on_the_loop_once_measured():
    m = Where()
    out = asyncio.run(_serve(m, INLINE_AFTER + 4))
    assert out == [float(i) for i in range(INLINE_AFTER + 4)] + [100.0 + i for i in range(6)]
    loop_thread = threading.get_ident()  # asyncio.run ran on this thread
    assert loop_thread not in m.threads[:INLINE_AFTER]  # measured in worker threads first
    assert all(t == loop_thread for t in m.threads[INLINE_AFTER:])


def test_slow_or_gpu_models_stay_in_worker_threads():
    for m in (Where(seconds=0.002), Where(kind="cuda")):
        asyncio.run(_serve(m, INLINE_AFTER + 2))
        assert threading.get_ident() not in m.threads
