"""A batch run in a worker thread comes back to the event loop in one call: its answers (each request its own
rows), or, when the model fails or the pool is gone, the error for every request in it; either way its
executor and host slot are given back and the runner goes idle."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from ground.errors import Internal
from hostd.batch_policy import BatchConfig
from hostd.batcher import ModelRunner, QueueLimits
from hostd.execution import ExecutionGate
from hostd.metrics import HostdMetrics
from hostd.runtimes.base import DeviceSpec, LoadedModel
from hostd.stats import ModelStats
from hostd.tensors import DecodedRequest


class Model(LoadedModel):
    """Doubles its input; fails while `fail` is set. Holds each run until `release` is set, so that requests
    sent meanwhile queue up and run together as one batch."""

    def __init__(self) -> None:
        self.device = DeviceSpec(kind="cpu")
        self.fail = False
        self.release = threading.Event()
        self.batches: list[int] = []
        self.threads: set[int] = set()

    def run(self, inputs, outputs):
        self.release.wait(5)
        self.threads.add(threading.get_ident())
        self.batches.append(int(inputs["x"].shape[0]))
        if self.fail:
            raise ValueError("boom")
        return {"y": inputs["x"] * 2}

    def close(self) -> None:
        pass


def _req(v: float, rows: int = 1) -> DecodedRequest:
    return DecodedRequest(inputs={"x": np.full((rows, 2), v, np.float32)}, outputs=["y"], raw=True, rows=rows,
                          shape_key=(), nbytes=8 * rows)


def _runner(model: LoadedModel, pool, gate: ExecutionGate, tenant: str = "t", name: str = "m",
            max_queue_size: int = 100) -> ModelRunner:
    return ModelRunner(tenant=tenant, model=name, loaded=model, config=BatchConfig(max_batch_size=8),
                       limits=QueueLimits(max_queue_size=max_queue_size), instances=1, pool=pool,
                       stats=ModelStats(), metrics=HostdMetrics(), gate=gate)


async def _first_then_batch(r: ModelRunner, model: Model, rows: list[int]):
    """One request that occupies the executor, then `rows` requests that queue behind it and form one batch."""
    first = asyncio.ensure_future(r.infer(_req(1.0)))
    await asyncio.sleep(0.05)  # the first one is running (held in the worker thread)
    rest = [asyncio.ensure_future(r.infer(_req(10.0 + i, n))) for i, n in enumerate(rows)]
    await asyncio.sleep(0.05)
    model.release.set()
    return await asyncio.gather(first, *rest, return_exceptions=True)


def test_a_batch_comes_back_with_each_requests_own_rows_and_frees_its_slot():
    model = Model()

    async def main():
        gate = ExecutionGate(2)
        with ThreadPoolExecutor(2) as pool:
            r = _runner(model, pool, gate)
            out = await _first_then_batch(r, model, [1, 3, 2])
            await asyncio.wait_for(r.wait_idle(), 5)
            return out, gate.free, r.busy

    out, free, busy = asyncio.run(main())
    assert model.batches == [1, 6]  # the three queued requests ran as one batch
    assert threading.get_ident() not in model.threads  # in worker threads
    np.testing.assert_array_equal(out[0]["y"], np.full((1, 2), 2.0))
    for i, n in enumerate([1, 3, 2]):
        np.testing.assert_array_equal(out[1 + i]["y"], np.full((n, 2), 2 * (10.0 + i)))
    assert free == 2 and not busy


def test_a_failing_model_fails_every_request_of_its_batch_and_frees_its_slot():
    model = Model()
    model.fail = True

    async def main():
        gate = ExecutionGate(2)
        with ThreadPoolExecutor(2) as pool:
            r = _runner(model, pool, gate)
            out = await _first_then_batch(r, model, [1, 1])
            await asyncio.wait_for(r.wait_idle(), 5)
            model.fail = False
            again = await r.infer(_req(3.0))  # the runner still serves
            return out, again, gate.free

    out, again, free = asyncio.run(main())
    assert len(out) == 3 and all(isinstance(e, Internal) and "boom" in str(e) for e in out)
    np.testing.assert_array_equal(again["y"], np.full((1, 2), 6.0))
    assert free == 2


def test_a_shut_down_pool_fails_the_request_instead_of_hanging():
    model = Model()
    model.release.set()

    async def main():
        gate = ExecutionGate(2)
        pool = ThreadPoolExecutor(1)
        pool.shutdown()
        r = _runner(model, pool, gate)
        with pytest.raises(Internal):
            await asyncio.wait_for(r.infer(_req(1.0)), 5)
        await asyncio.wait_for(r.wait_idle(), 5)
        return gate.free

    assert asyncio.run(main()) == 2
    assert model.batches == []


@pytest.mark.parametrize("continues", [True, False])
def test_the_worker_that_finished_a_batch_starts_the_next_one_while_the_loop_is_busy(continues):
    """With `continues` (the default), the model's next batch starts on the thread that ran the last one, as
    it finishes, even while the event loop is busy (here: blocked); handed back, it waits for the loop."""
    model = Model()

    async def main():
        gate = ExecutionGate(2, continues=continues)
        with ThreadPoolExecutor(2) as pool:
            r = _runner(model, pool, gate)
            first = asyncio.ensure_future(r.infer(_req(1.0)))
            await asyncio.sleep(0.05)  # the first one is running (held in the worker thread)
            rest = [asyncio.ensure_future(r.infer(_req(10.0 + i, n))) for i, n in enumerate([2, 1])]
            await asyncio.sleep(0.05)
            model.release.set()
            t0 = time.monotonic()
            while len(model.batches) < 2 and time.monotonic() - t0 < 1.0:
                time.sleep(0.005)  # the loop is busy: nothing on it runs meanwhile
            started_while_busy = len(model.batches) >= 2
            out = await asyncio.gather(first, *rest)
            await asyncio.wait_for(r.wait_idle(), 5)
            return started_while_busy, out, gate.free, r.busy

    started_while_busy, out, free, busy = asyncio.run(main())
    assert started_while_busy is continues
    assert model.batches == [1, 3]
    if continues:
        assert len(model.threads) == 1  # the same worker ran both
    np.testing.assert_array_equal(out[0]["y"], np.full((1, 2), 2.0))
    for i, n in enumerate([2, 1]):
        np.testing.assert_array_equal(out[1 + i]["y"], np.full((n, 2), 2 * (10.0 + i)))
    assert free == 2 and not busy


def test_a_finished_batch_gives_its_slot_to_the_model_waiting_for_one_before_its_own_next_batch():
    """On a host of one slot, a batch's finish hands the slot to the other model that asked for it first; the
    worker goes on with nothing of its own (the core decides, not the thread that happens to be free)."""
    order: list[str] = []
    release = threading.Event()

    class Logged(Model):
        def __init__(self, name: str) -> None:
            super().__init__()
            self.name = name
            self.release = release

        def run(self, inputs, outputs):
            out = super().run(inputs, outputs)
            order.append(f"{self.name}{inputs['x'].shape[0]}")
            return out

    a, b = Logged("a"), Logged("b")

    async def main():
        gate = ExecutionGate(1)
        with ThreadPoolExecutor(2) as pool:
            ra, rb = _runner(a, pool, gate, "ta", "a"), _runner(b, pool, gate, "tb", "b")
            first = asyncio.ensure_future(ra.infer(_req(1.0)))
            await asyncio.sleep(0.05)
            other = asyncio.ensure_future(rb.infer(_req(2.0)))
            await asyncio.sleep(0.02)
            more = [asyncio.ensure_future(ra.infer(_req(3.0))) for _ in range(2)]
            await asyncio.sleep(0.02)
            release.set()
            await asyncio.wait_for(asyncio.gather(first, other, *more), 5)
            return gate.free

    assert asyncio.run(main()) == 1
    assert order == ["a1", "b1", "a2"]


def test_a_fault_in_the_cores_finish_step_on_a_worker_still_answers_the_batch_and_is_logged():
    model = Model()
    model.release.set()
    seen: list[BaseException] = []

    async def main():
        asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: seen.append(ctx.get("exception")))
        gate = ExecutionGate(2)

        def broken(runner, requests):
            raise RuntimeError("core fault")

        gate.finish_here = broken  # type: ignore[method-assign]
        with ThreadPoolExecutor(2) as pool:
            r = _runner(model, pool, gate)
            out = await asyncio.wait_for(r.infer(_req(4.0)), 5)
            await asyncio.sleep(0.05)
            return out

    out = asyncio.run(main())
    np.testing.assert_array_equal(out["y"], np.full((1, 2), 8.0))
    assert any(isinstance(e, RuntimeError) and "core fault" in str(e) for e in seen)


class Sleepy(LoadedModel):
    """Doubles its input after a short random sleep (the GIL released, as a runtime's run releases it)."""

    def __init__(self, seed: int, low_s: float = 0.0, high_s: float = 0.002) -> None:
        self.device = DeviceSpec(kind="cpu")
        self.rng = np.random.default_rng(seed)
        self.low_s, self.high_s = low_s, high_s
        self.batches = 0

    def run(self, inputs, outputs):
        time.sleep(float(self.rng.uniform(self.low_s, self.high_s)))
        self.batches += 1
        return {"y": inputs["x"] * 2}

    def close(self) -> None:
        pass


def test_under_load_from_two_models_every_request_gets_its_own_rows_and_every_slot_comes_back():
    """Workers that continue their models' batches, two models on two slots, requests arriving all the while:
    no request gets another's rows, none is lost, and the host ends with every slot free."""
    rng = np.random.default_rng(7)
    plan = [(int(rng.integers(0, 2)), int(rng.integers(1, 4)), float(i)) for i in range(400)]

    async def main():
        gate = ExecutionGate(2)
        with ThreadPoolExecutor(3) as pool:
            models = [Sleepy(1), Sleepy(2)]
            runners = [_runner(m, pool, gate, f"t{i}", f"m{i}", max_queue_size=1000) for i, m in enumerate(models)]

            async def one(which: int, rows: int, v: float):
                await asyncio.sleep(float(rng.uniform(0, 0.2)))
                return await runners[which].infer(_req(v, rows))

            out = await asyncio.wait_for(asyncio.gather(*(one(*p) for p in plan)), 30)
            for r in runners:
                await asyncio.wait_for(r.wait_idle(), 5)
            return out, gate.free, [m.batches for m in models]

    out, free, batches = asyncio.run(main())
    for (_, rows, v), res in zip(plan, out, strict=True):
        np.testing.assert_array_equal(res["y"], np.full((rows, 2), 2 * v))
    assert free == 2
    assert all(b > 0 for b in batches) and sum(batches) < len(plan)  # batched, on both models


def test_unloading_a_model_while_its_worker_continues_answers_or_refuses_every_request():
    """close() while the worker goes on from batch to batch: each request is answered with its own rows or
    refused UNAVAILABLE (unloaded), nothing hangs, and the slot comes back."""
    from ground.errors import Unavailable

    async def main():
        gate = ExecutionGate(2)
        with ThreadPoolExecutor(2) as pool:
            r = _runner(Sleepy(3, 0.002, 0.003), pool, gate)  # 8 batches: >= 16 ms
            tasks = [asyncio.ensure_future(r.infer(_req(float(i)))) for i in range(60)]
            await asyncio.sleep(0.004)
            r.close()
            out = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10)
            await asyncio.wait_for(r.wait_idle(), 5)
            return out, gate.free

    out, free = asyncio.run(main())
    answered = 0
    for i, res in enumerate(out):
        if isinstance(res, BaseException):
            assert isinstance(res, Unavailable), res
        else:
            np.testing.assert_array_equal(res["y"], np.full((1, 2), 2.0 * i))
            answered += 1
    assert 0 < answered < len(out)
    assert free == 2
