"""A lone batch of one request runs on every core (hostd/core/sizing.py): the ONNX runtime's second session
reads the same weights in place and answers as the first; the runner runs the batch the dispatch marks wide
on it, and every other batch on the plan's session."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from hostd.batch_policy import BatchConfig
from hostd.batcher import INLINE_AFTER, ModelRunner, QueueLimits
from hostd.execution import ExecutionGate
from hostd.metrics import HostdMetrics
from hostd.runtimes import onnx as onnx_rt
from hostd.runtimes.base import DeviceSpec, LoadedModel
from hostd.stats import ModelStats
from hostd.tensors import DecodedRequest
from mmhost.demo_models import build_onnx_mlp, onnx_manifest

WIDE = DeviceSpec(ort_intra_op_threads=1, ort_wide_threads=2)


def test_the_wide_session_reads_the_weights_in_place_and_answers_as_the_plan_s(tmp_path):
    src = tmp_path / "m.onnx"
    build_onnx_mlp(src, (16, 64, 4))
    manifest = onnx_manifest("acme", "m", "1", src, "model.onnx")
    buf = bytearray(src.read_bytes())
    split = onnx_rt.split_model(memoryview(buf))
    assert split is not None
    m = onnx_rt.OnnxModel(split[0], manifest, WIDE)
    x = {"input": np.random.default_rng(0).random((1, 16), dtype=np.float32)}
    assert m.wide and np.allclose(m.run_wide(x, [])["output"], m.run(x, [])["output"])
    # weights it would copy (the file itself), or a plan with every core per slot already: no second session
    assert not onnx_rt.OnnxModel(src.read_bytes(), manifest, WIDE).wide
    assert not onnx_rt.OnnxModel(src, manifest, WIDE).wide
    assert not onnx_rt.OnnxModel(split[0], manifest, DeviceSpec(ort_intra_op_threads=2, ort_wide_threads=2)).wide


class Where(LoadedModel):
    """Records which session each batch ran on; each run waits for `release`, so that requests sent meanwhile
    queue up and run together."""

    wide = True

    def __init__(self) -> None:
        self.device = DeviceSpec(kind="cpu")
        self.ran: list[tuple[str, int]] = []
        self.release = threading.Event()

    def run(self, inputs, outputs):
        self.release.wait(5)
        self.ran.append(("plan", int(inputs["x"].shape[0])))
        return {"y": inputs["x"]}

    def run_wide(self, inputs, outputs):
        self.release.wait(5)
        self.ran.append(("wide", int(inputs["x"].shape[0])))
        return {"y": inputs["x"]}

    def close(self) -> None:
        pass


def _req(rows: int = 1) -> DecodedRequest:
    return DecodedRequest(inputs={"x": np.ones((rows, 2), np.float32)}, outputs=["y"], raw=True, rows=rows,
                          shape_key=(), nbytes=8 * rows)


def test_the_runner_runs_a_lone_request_wide_and_a_batch_of_several_on_the_plan(monkeypatch):
    model = Where()

    async def main(wide_max_s: float):
        gate = ExecutionGate(2, wide_max_s=wide_max_s)
        with ThreadPoolExecutor(2) as pool:
            r = ModelRunner(tenant="t", model="m", loaded=model, config=BatchConfig(max_batch_size=8),
                            limits=QueueLimits(max_queue_size=100), instances=1, pool=pool, stats=ModelStats(),
                            metrics=HostdMetrics(), gate=gate)
            model.release.clear()
            first = asyncio.ensure_future(r.infer(_req()))  # alone on the host: wide
            await asyncio.sleep(0.05)  # it is running (held in the worker thread)
            rest = [asyncio.ensure_future(r.infer(_req(2))) for _ in range(2)]  # queue behind it: one batch
            await asyncio.sleep(0.05)
            model.release.set()
            await asyncio.gather(first, *rest)
            await r.infer(_req(3))  # alone again, but its batches measured ~50 ms: past the bound, on the plan
            await asyncio.wait_for(r.wait_idle(), 5)
            return gate.free

    assert asyncio.run(main(0.005)) == 2 and model.ran == [("wide", 1), ("plan", 4), ("plan", 3)]
    model.ran.clear()
    assert asyncio.run(main(0.0)) == 2 and all(w == "plan" for w, _ in model.ran)  # no wide batches


class Scripted:
    """A LoopIdle stand-in: answers `take` from a script, then False."""

    def __init__(self, *answers: bool) -> None:
        self.answers = list(answers)

    def take(self, now: float) -> bool:
        return self.answers.pop(0) if self.answers else False


class Thread(Where):
    """Where, also recording whether each batch ran on the event loop's thread."""

    def __init__(self) -> None:
        super().__init__()
        self.loop_thread = threading.get_ident()
        self.on_loop: list[bool] = []

    def run(self, inputs, outputs):
        self.on_loop.append(threading.get_ident() == self.loop_thread)
        return super().run(inputs, outputs)

    def run_wide(self, inputs, outputs):
        self.on_loop.append(threading.get_ident() == self.loop_thread)
        return super().run_wide(inputs, outputs)


def test_a_lone_request_on_an_idle_loop_runs_wide_on_the_loop_and_one_started_by_a_finish_does_not():
    hog, model = Thread(), Thread()

    async def main() -> None:
        # the hog's lone request finds the loop busy; the model's second request finds it idle
        gate = ExecutionGate(2, wide_max_s=0.005, loop_idle=Scripted(False, True))  # type: ignore[arg-type]
        with ThreadPoolExecutor(2) as pool:
            def runner(name: str, loaded: Thread) -> ModelRunner:
                return ModelRunner(tenant="t", model=name, loaded=loaded, config=BatchConfig(max_batch_size=8),
                                   limits=QueueLimits(max_queue_size=100), instances=1, pool=pool,
                                   stats=ModelStats(), metrics=HostdMetrics(), gate=gate)

            h, r = runner("hog", hog), runner("m", model)
            hog.release.clear()
            model.release.set()
            first = asyncio.ensure_future(h.infer(_req()))  # wide on a worker thread, every slot held
            await asyncio.sleep(0.05)
            second = asyncio.ensure_future(r.infer(_req()))  # waits for a slot; alone once the hog finishes
            await asyncio.sleep(0.05)
            assert model.ran == []
            hog.release.set()
            await asyncio.gather(first, second)
            await r.infer(_req())  # alone, and the loop was idle: wide, on the loop thread
            await asyncio.wait_for(asyncio.gather(h.wait_idle(), r.wait_idle()), 5)
            assert gate.free == 2

    asyncio.run(main())
    assert hog.ran == [("wide", 1)] and hog.on_loop == [False]
    # the model's first batch was started by the hog's finish, whose answer still waited on the loop
    assert model.ran == [("wide", 1), ("wide", 1)]
    assert model.on_loop == [False, True]


def _packs(sess) -> bool:
    """Whether an ONNX Runtime session prepacks its weights (its options as built)."""
    opts = sess.get_session_options()
    try:
        return opts.get_session_config_entry("session.disable_prepacking") != "1"
    except RuntimeError:  # never set: ORT's default, prepacked
        return True


def test_with_wide_prepacked_the_wide_session_packs_at_a_first_load_and_after_a_deferred_one(tmp_path):
    src = tmp_path / "m.onnx"
    build_onnx_mlp(src, (16, 64, 4))
    manifest = onnx_manifest("acme", "m", "1", src, "model.onnx")
    x = {"input": np.random.default_rng(1).random((1, 16), dtype=np.float32)}

    def load(device: DeviceSpec, defer: bool) -> onnx_rt.OnnxModel:
        split = onnx_rt.split_model(memoryview(bytearray(src.read_bytes())))
        assert split is not None
        return onnx_rt.OnnxModel(split[0], manifest, device, defer_prepack=defer)

    packed = DeviceSpec(ort_intra_op_threads=1, ort_wide_threads=2, ort_wide_prepacked=True)
    first = load(packed, defer=False)
    assert first.wide and _packs(first._wide)  # measured with the load: its memory is the model's
    reload = load(packed, defer=True)
    assert reload.wide and not _packs(reload._wide)  # answers first, as fast as a reload is
    before = reload.run_wide(x, [])["output"]
    reload.upgrade()
    assert _packs(reload._wide) and not reload.upgrade_pending
    np.testing.assert_allclose(reload.run_wide(x, [])["output"], before, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(first.run_wide(x, [])["output"], before, rtol=1e-5, atol=1e-6)
    # the default: never a second packed copy, before or after the upgrade
    plain = load(WIDE, defer=True)
    plain.upgrade()
    assert plain.wide and not _packs(plain._wide) and not _packs(load(WIDE, defer=False)._wide)


def test_a_microsecond_model_runs_on_its_plan_s_session_on_the_loop_even_when_the_loop_was_idle():
    model = Thread()
    idle = Scripted()  # the loop never idle while the model's batches are measured on worker threads

    async def main() -> None:
        gate = ExecutionGate(2, wide_max_s=0.005, loop_idle=idle)  # type: ignore[arg-type]
        with ThreadPoolExecutor(2) as pool:
            r = ModelRunner(tenant="t", model="m", loaded=model, config=BatchConfig(max_batch_size=8),
                            limits=QueueLimits(max_queue_size=100), instances=1, pool=pool, stats=ModelStats(),
                            metrics=HostdMetrics(), gate=gate)
            model.release.set()
            for _ in range(INLINE_AFTER):
                await r.infer(_req())
            idle.answers = [True]
            await r.infer(_req())
            await asyncio.wait_for(r.wait_idle(), 5)

    asyncio.run(main())
    assert model.ran[:INLINE_AFTER] == [("wide", 1)] * INLINE_AFTER and not any(model.on_loop[:INLINE_AFTER])
    assert model.ran[-1] == ("plan", 1) and model.on_loop[-1]  # measured in microseconds: inline, as before
    assert idle.answers == [True]  # the loop's idle wake was left for a batch that needs it
