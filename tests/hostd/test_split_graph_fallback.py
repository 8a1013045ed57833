"""hostd/loader.py's fallback when a graph split from the model's bytes does not load: the model file is
loaded as it is (hostd/runtimes/onnx.py splits nothing itself: splitting is the loader's decision), and the
file is found without holding the loader's lock (it may wait for the disk tier's write or read storage)."""

from __future__ import annotations

import numpy as np
import pytest

from catalog.publish import publish_version
from catalog.repository import ModelRepository
from hostd.cache.tiers import DiskTier, RamTier
from hostd.loader import Loader
from hostd.memory import CpuProbe
from hostd.runtimes import onnx as onnx_rt
from hostd.runtimes.base import DeviceSpec, GraphSource, RuntimeLoadError
from mmhost.demo_models import build_onnx_mlp, onnx_manifest
from storage_adapters.local import LocalStorage

DEV = DeviceSpec(ort_intra_op_threads=1)


@pytest.fixture
def model(tmp_path):
    repo = ModelRepository(LocalStorage(tmp_path / "store"))
    src = tmp_path / "a.onnx"
    build_onnx_mlp(src, (16, 64, 4), seed=0)  # weights of 4 KB: split out of the file
    m = publish_version(repo, onnx_manifest("acme", "a", "1", src, "model.onnx"), {"model.onnx": src})
    return repo, m, src


def _want(src, x):
    import onnxruntime as ort

    return ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]


def test_a_split_graph_that_does_not_load_falls_back_to_the_file_as_it_is(model, tmp_path, monkeypatch):
    repo, m, src = model
    loader = Loader(repo.storage, DiskTier(tmp_path / "cache", 1 << 30), RamTier(1 << 30), DEV, CpuProbe())

    # an ONNX Runtime that cannot read weights from memory: every graph split from the file fails to load
    def no_weights_in_memory(*_a, **_k):
        raise RuntimeLoadError("no external data in memory here")

    monkeypatch.setattr(onnx_rt, "_in_memory", no_weights_in_memory)

    # a disk tier that cannot be written (full): the second try has the file only as bytes, from storage again
    def disk_full(*_a, **_k):
        raise OSError("no space left on device")

    monkeypatch.setattr(loader, "_write", disk_full)
    sources, lock_held = [], []
    real_source = loader._source

    def source(*a, **k):
        lock_held.append(loader._lock.locked())
        out = real_source(*a, **k)
        sources.append(out[0])
        return out

    monkeypatch.setattr(loader, "_source", source)
    x = np.random.default_rng(2).random((3, 16), dtype=np.float32)
    want = _want(src, x)
    res = loader.load(m)
    try:
        np.testing.assert_allclose(res.model.run({"input": x}, ["output"])["output"], want, rtol=1e-5, atol=1e-6)
        assert res.source_tier == "storage" and res.saved_graph is False
        assert res.model.kept_bytes == 0, "the plain file: no weights read in place from the buffer"
    finally:
        res.model.close()
    assert isinstance(sources[0], GraphSource) and not isinstance(sources[1], GraphSource)
    assert lock_held == [False, False], "the file for the second try is found outside the loader's lock"
    assert res.waits["locked"] >= 0 and res.waits["lock_wait"] >= 0

    # the RAM tier now holds the file as it is: a reload from it loads it as it is too
    again = loader.load(m)
    try:
        assert again.source_tier == "ram" and again.model.kept_bytes == 0
        np.testing.assert_allclose(again.model.run({"input": x}, ["output"])["output"], want, rtol=1e-5, atol=1e-6)
    finally:
        again.model.close()
    loader.flush()


def test_the_second_try_waits_for_the_disk_tiers_write_outside_the_loaders_lock(model, tmp_path, monkeypatch):
    """The verified bytes go to the disk tier, and the second try loads the file from there once written:
    that wait (a whole model file written at the lowest priority) must not hold every other load's lock."""
    repo, m, src = model
    loader = Loader(repo.storage, DiskTier(tmp_path / "cache", 1 << 30), None, DEV, CpuProbe())

    def no_weights_in_memory(*_a, **_k):
        raise RuntimeLoadError("no external data in memory here")

    monkeypatch.setattr(onnx_rt, "_in_memory", no_weights_in_memory)
    lock_held = []
    real_wait = loader._wait_written

    def wait_written(key):
        lock_held.append(loader._lock.locked())
        real_wait(key)

    monkeypatch.setattr(loader, "_wait_written", wait_written)
    x = np.random.default_rng(3).random((2, 16), dtype=np.float32)
    res = loader.load(m)
    try:
        assert res.source_tier == "disk"
        np.testing.assert_allclose(res.model.run({"input": x}, ["output"])["output"], _want(src, x),
                                   rtol=1e-5, atol=1e-6)
    finally:
        res.model.close()
    loader.flush()
    assert lock_held == [False, False]


def test_the_runtime_loads_bytes_as_they_are(model):
    """Bytes given to the ONNX runtime are the model file: no graph is split from them behind the loader."""
    _, m, src = model
    loaded = onnx_rt.OnnxModel(src.read_bytes(), m, DEV)
    try:
        assert loaded.kept_bytes == 0
    finally:
        loaded.close()
