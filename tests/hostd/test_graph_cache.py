"""The cold path and the graph cache, on a real local store, real tiers and real ONNX Runtime sessions:
a cold load reads the model into memory and leaves the disk tier a verified copy and a saved optimized graph;
reloads use the graph; a graph is found only for its own model bytes, ORT version and provider; a graph
changed on disk, or one that does not load, falls back to the model file; bytes that fail the manifest's
hash are refused and nothing of them is kept anywhere."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from catalog.publish import publish_version
from catalog.repository import ModelRepository
from ground.errors import Unavailable
from hostd.cache.graphs import GRAPHS, GraphId
from hostd.cache.stamps import marker, sha256_file, stamp, verified
from hostd.cache.tiers import DiskTier, RamTier
from hostd.loader import Loader
from hostd.memory import CpuProbe
from hostd.runtimes.base import DeviceSpec
from hostd.runtimes.onnx import graph_cache_key
from mmhost.demo_models import build_onnx_mlp, onnx_manifest
from storage_adapters.local import LocalStorage

DEV = DeviceSpec(ort_intra_op_threads=1)


@pytest.fixture
def published(tmp_path):
    """Two different ONNX models in a local store: (repo, manifest a, manifest b, file a, file b)."""
    repo = ModelRepository(LocalStorage(tmp_path / "store"))
    out = []
    for name, seed in (("a", 0), ("b", 1)):
        src = tmp_path / f"{name}.onnx"
        build_onnx_mlp(src, (16, 64, 4), seed=seed)
        out.append((publish_version(repo, onnx_manifest("acme", name, "1", src, "model.onnx"), {"model.onnx": src}), src))
    return repo, out[0][0], out[1][0], out[0][1], out[1][1]


def _loader(repo, tmp_path, ram: bool) -> Loader:
    return Loader(repo.storage, DiskTier(tmp_path / "cache", 1 << 30), RamTier(1 << 30) if ram else None, DEV, CpuProbe())


def _check(loader: Loader, m, src):
    """Load, compare with ONNX Runtime on the original file, close; the LoadResult."""
    import onnxruntime as ort

    x = np.random.default_rng(2).random((3, 16), dtype=np.float32)
    want = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    res = loader.load(m)
    try:
        np.testing.assert_allclose(res.model.run({"input": x}, ["output"])["output"], want, rtol=1e-5, atol=1e-6)
    finally:
        res.model.close()
    return res


def _saved_graph(published, tmp_path):
    """Model a loaded once (outputs checked) by a loader without a RAM tier, its graph saved:
    (loader, manifest a, file a, a's GraphId)."""
    repo, a, _, src_a, _ = published
    loader = _loader(repo, tmp_path, ram=False)
    _check(loader, a, src_a)
    loader.flush()
    return loader, a, src_a, GraphId(a.files[0].sha256, graph_cache_key(DEV))


def test_cold_load_leaves_a_verified_file_and_a_saved_graph_that_reloads_use(published, tmp_path):
    repo, a, _, src_a, _ = published
    first = _loader(repo, tmp_path, ram=True)
    res = _check(first, a, src_a)
    assert res.source_tier == "storage" and res.saved_graph is False
    assert res.timings["fetch"] > 0 and res.timings["verify"] > 0
    first.flush()  # the disk tier's write and the graph are made in the background
    version = first.disk.path(a.key())
    assert verified(version / "model.onnx", a.files[0].sha256)
    assert sha256_file(version / "model.onnx") == a.files[0].sha256, "the exact file, although loaded rearranged"
    gid = GraphId(a.files[0].sha256, graph_cache_key(DEV))
    assert first.graphs.find(a.key(), gid) is not None

    assert _check(first, a, src_a).source_tier == "ram", "RAM tier: the bytes read on the cold load"

    # a second loader on the same disk, RAM tier off: the saved graph
    res = _check(_loader(repo, tmp_path, ram=False), a, src_a)
    assert res.source_tier == "disk" and res.saved_graph is True
    # RAM tier filled from a disk load holds the saved graph
    third = _loader(repo, tmp_path, ram=True)
    assert _check(third, a, src_a).source_tier == "disk"
    third.remember(a)
    res = _check(third, a, src_a)
    assert res.source_tier == "ram" and res.saved_graph is True


def test_a_graph_is_only_ever_found_for_its_own_model_ort_version_and_provider(published, tmp_path):
    repo, a, b, src_a, src_b = published
    loader = _loader(repo, tmp_path, ram=False)
    for m, src in ((a, src_a), (b, src_b)):
        _check(loader, m, src)
    loader.flush()
    ga = GraphId(a.files[0].sha256, graph_cache_key(DEV))
    gb = GraphId(b.files[0].sha256, graph_cache_key(DEV))
    graph_a = loader.graphs.find(a.key(), ga)
    assert graph_a is not None and loader.graphs.find(b.key(), gb) is not None
    # another ORT version, another provider, another model's bytes: not found
    assert loader.graphs.find(a.key(), GraphId(ga.sha256, "ort0.0.1-cpu")) is None
    assert loader.graphs.find(a.key(), GraphId(ga.sha256, ga.runtime.rsplit("-", 1)[0] + "-cuda")) is None
    assert loader.graphs.find(a.key(), GraphId(gb.sha256, ga.runtime)) is None

    # a's graph planted under b's version, named for b's bytes: its meta says a's sha256, so never served
    planted = loader.disk.path(b.key()) / GRAPHS / gb.name
    for f in planted.iterdir():
        f.unlink()
    for f in graph_a.parent.iterdir():
        (planted / f.name).write_bytes(f.read_bytes())
    for name in ("graph.onnx", "weights.bin"):  # stamps valid for the copies: only the owner is wrong
        marker(planted / name).write_text(stamp(planted / name, sha256_file(planted / name)))
    assert loader.graphs.find(b.key(), gb) is None and not planted.exists(), "removed, not served"
    res = _check(loader, b, src_b)  # b's own outputs: its file, not a's graph
    assert res.source_tier == "disk" and res.saved_graph is False


def test_a_changed_saved_graph_falls_back_to_the_model_file(published, tmp_path):
    loader, a, src_a, gid = _saved_graph(published, tmp_path)
    weights = loader.graphs.find(a.key(), gid).parent / "weights.bin"
    st = weights.stat()
    bad = bytearray(weights.read_bytes())
    bad[len(bad) // 2] ^= 0xFF  # same size, a weight changed: wrong answers if it were served
    weights.write_bytes(bytes(bad))
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    res = _check(loader, a, src_a)  # asserts the outputs of the original model
    assert res.source_tier == "disk" and res.saved_graph is False
    loader.flush()
    assert loader.graphs.find(a.key(), gid) is not None, "saved again from the model file"
    assert _check(loader, a, src_a).saved_graph is True


def test_a_saved_graph_that_does_not_load_falls_back_to_the_model_file(published, tmp_path):
    loader, a, src_a, gid = _saved_graph(published, tmp_path)
    graph = loader.graphs.find(a.key(), gid)
    # garbage, yet stamped as if the cache had written it: only loading it can tell
    graph.write_bytes(b"\x08\x07 not a graph")
    digest = sha256_file(graph)
    marker(graph).write_text(stamp(graph, digest))
    meta = json.loads((graph.parent / "meta.json").read_text())
    meta["files"]["graph.onnx"] = digest
    (graph.parent / "meta.json").write_text(json.dumps(meta))
    assert loader.graphs.find(a.key(), gid) is not None
    res = _check(loader, a, src_a)
    assert res.source_tier == "disk" and res.saved_graph is False
    assert loader.graphs.invalid == 1, "the entry was removed"
    loader.flush()
    assert _check(loader, a, src_a).saved_graph is True, "and saved again from the model file"


def test_bytes_that_fail_the_hash_are_refused_and_nothing_is_kept(published, tmp_path):
    repo, a, _, _, _ = published
    key = repo.file_key(a, "model.onnx")
    path = repo.storage.root / key
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0x01  # same size
    path.write_bytes(bytes(data))
    loader = _loader(repo, tmp_path, ram=True)
    with pytest.raises(Unavailable) as ei:
        loader.load(a)
    assert ei.value.reason == "integrity" and "sha256" in ei.value.message
    loader.flush()
    assert a.key() not in loader.ram and loader.ram.used == 0
    assert not (loader.disk.path(a.key()) / "model.onnx").exists()
    assert not (loader.disk.path(a.key()) / GRAPHS).exists()
    path.write_bytes(bytes(data[: len(data) // 2]))  # truncated
    with pytest.raises(Unavailable) as ei:
        loader.load(a)
    assert ei.value.reason == "integrity" and "bytes" in ei.value.message
    assert a.key() not in loader.ram
