"""A reload answers before ONNX Runtime has prepacked the weights, and prepacks them right after: on real
sessions, a real loader with its tiers and a real hostd. The model answers as ORT does on the original file
before and after the swap; a first load is whole before it answers; a reload counts the memory of the
model's last load; a model closed before its upgrade stays closed."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnxruntime as ort
import pytest

from catalog.publish import publish_version
from catalog.repository import ModelRepository
from hostd.cache.tiers import DiskTier, RamTier
from hostd.loader import Loader
from hostd.memory import CpuProbe
from hostd.runtimes import onnx as onnx_rt
from hostd.runtimes.base import DeviceSpec
from mmhost.demo_models import build_onnx_mlp, onnx_manifest
from protos import grpc_service_pb2 as pb
from storage_adapters.local import LocalStorage
from tests.hostd_proc import HostdProc, metric_value

DEV = DeviceSpec(ort_intra_op_threads=1)
DIMS = (16, 256, 256, 4)
BIG_DIMS = (16, 1536, 1536, 4)


@pytest.fixture
def model(tmp_path):
    src = tmp_path / "m.onnx"
    build_onnx_mlp(src, DIMS)
    x = np.random.default_rng(3).random((5, DIMS[0]), dtype=np.float32)
    want = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    return src, onnx_manifest("acme", "m", "1", src, "model.onnx"), x, want


def _out(m, x):
    return m.run({"input": x}, ["output"])["output"]


def _in_place(src):
    """The file split for loading in place: a graph whose weights are read where they lie in a buffer."""
    split = onnx_rt.split_model(memoryview(bytearray(src.read_bytes())))
    assert split is not None
    return split[0]


def test_a_deferred_model_answers_as_ort_before_and_after_its_upgrade(model):
    src, manifest, x, want = model
    m = onnx_rt.OnnxModel(_in_place(src), manifest, DEV, defer_prepack=True)
    assert m.upgrade_pending
    np.testing.assert_allclose(_out(m, x), want, rtol=1e-5, atol=1e-6)
    m.upgrade()
    assert not m.upgrade_pending
    np.testing.assert_allclose(_out(m, x), want, rtol=1e-5, atol=1e-6)
    m.upgrade()  # nothing left to do
    m.close()


def test_only_weights_read_in_place_on_cpu_are_deferred(model):
    src, manifest, x, want = model
    # the file's bytes: a session copies their weights, a second one would copy them again
    assert not onnx_rt.OnnxModel(src.read_bytes(), manifest, DEV, defer_prepack=True).upgrade_pending
    assert not onnx_rt.OnnxModel(_in_place(src), manifest, DEV).upgrade_pending  # not asked


def test_an_upgrade_after_close_leaves_the_model_closed(model):
    src, manifest, x, _ = model
    m = onnx_rt.OnnxModel(_in_place(src), manifest, DEV, defer_prepack=True)
    m.close()
    m.upgrade()
    assert not m.upgrade_pending
    with pytest.raises(AttributeError):  # no session: a closed model runs nothing
        _out(m, x)


def test_the_loader_defers_only_reloads_and_counts_the_last_load_s_memory(model, tmp_path):
    src, _, x, want = model
    repo = ModelRepository(LocalStorage(tmp_path / "store"))
    m = publish_version(repo, onnx_manifest("acme", "m", "1", src, "model.onnx"), {"model.onnx": src})
    phases: list[tuple[str, float]] = []
    loader = Loader(repo.storage, DiskTier(tmp_path / "cache", 1 << 30), RamTier(1 << 30), DEV, CpuProbe(),
                    on_phase=lambda p, s: phases.append((p, s)))
    first = loader.load(m)
    assert first.source_tier == "storage" and not first.model.upgrade_pending  # whole before it answers
    first.model.close()
    loader.flush()
    reserve = first.memory_delta * 3  # as if the last load had measured more than this one can see
    again = loader.load(m, reserve_bytes=reserve)
    assert again.source_tier == "ram"
    assert again.memory_delta >= reserve
    np.testing.assert_allclose(_out(again.model, x), want, rtol=1e-5, atol=1e-6)
    loader.flush()
    assert not again.model.upgrade_pending
    assert [p for p, _ in phases] == ["prepack"]
    np.testing.assert_allclose(_out(again.model, x), want, rtol=1e-5, atol=1e-6)
    again.model.close()


def test_a_reload_on_a_real_hostd_is_prepacked_in_the_background(tmp_path):
    # large enough (9 MB) that prepacking takes a while: the requests below run across the swap
    src = tmp_path / "big.onnx"
    build_onnx_mlp(src, BIG_DIMS)
    x = np.random.default_rng(3).random((5, BIG_DIMS[0]), dtype=np.float32)
    sess = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    want = sess.run(None, {"input": x})[0]
    store = tmp_path / "store"
    repo = ModelRepository(LocalStorage(store))
    publish_version(repo, onnx_manifest("demo", "m", "1", src, "model.onnx"), {"model.onnx": src})
    h = HostdProc(str(store), tmp_path / "h", args=["--ram-cache", "256MiB"])
    try:
        req = pb.ModelInferRequest(model_name="m")
        req.inputs.add(name="input", datatype="FP32", shape=list(x.shape))
        req.raw_input_contents.append(x.tobytes())

        def answer() -> np.ndarray:
            r = h.stub.ModelInfer(req, timeout=60)
            return np.frombuffer(r.raw_output_contents[0], np.float32).reshape(want.shape)

        def prepacks() -> float:
            return metric_value(h.metrics_text(), "mmhost_model_load_duration_seconds_count", phase="prepack")

        np.testing.assert_allclose(answer(), want, rtol=1e-5, atol=1e-6)
        assert prepacks() == 0  # the first load prepacked before it answered
        h.stub.RepositoryModelUnload(pb.RepositoryModelUnloadRequest(model_name="m"))
        # requests of their own rows, batched together while the sessions are swapped: each gets its own answer
        rows = [np.random.default_rng(10 + i).random((1 + i % 3, BIG_DIMS[0]), dtype=np.float32) for i in range(24)]

        def own(mine: np.ndarray) -> None:
            r = pb.ModelInferRequest(model_name="m")
            r.inputs.add(name="input", datatype="FP32", shape=list(mine.shape))
            r.raw_input_contents.append(mine.tobytes())
            got = np.frombuffer(h.stub.ModelInfer(r, timeout=60).raw_output_contents[0], np.float32)
            np.testing.assert_allclose(got.reshape(len(mine), -1), sess.run(None, {"input": mine})[0],
                                       rtol=1e-5, atol=1e-6)

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(own, rows))
        deadline = time.monotonic() + 30
        while prepacks() < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert prepacks() == 1
        np.testing.assert_allclose(answer(), want, rtol=1e-5, atol=1e-6)
    finally:
        h.stop()
