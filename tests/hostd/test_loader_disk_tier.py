"""The disk tier trusts only what it verified: a cached file changed or replaced since its verification
(its inode, size or modification time differ from the marker's) is fetched and verified again, never served
as is. Real local store, real disk tier, real files."""

from __future__ import annotations

import hashlib
import os

from catalog.publish import publish_version
from catalog.repository import ModelRepository
from hostd.cache.tiers import DiskTier
from hostd.loader import Loader
from hostd.memory import CpuProbe
from hostd.runtimes.base import DeviceSpec
from mmhost.demo_models import build_onnx_mlp, onnx_manifest
from storage_adapters.local import LocalStorage


def test_a_changed_cached_file_is_fetched_again(tmp_path):
    src = tmp_path / "m.onnx"
    build_onnx_mlp(src, (8, 16, 2))
    repo = ModelRepository(LocalStorage(tmp_path / "store"))
    m = publish_version(repo, onnx_manifest("acme", "m", "1", src, "model.onnx"), {"model.onnx": src})
    loader = Loader(repo.storage, DiskTier(tmp_path / "cache", 1 << 30), None, DeviceSpec(), CpuProbe())
    good = src.read_bytes()
    path = loader.fetch(m) / "model.onnx"
    assert path.read_bytes() == good

    timings: dict[str, float] = {}
    loader.fetch(m, timings)
    assert timings["fetch"] == 0.0, "an untouched verified file is used as it is"

    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0xFF  # same size, different bytes: bit rot or a tampered cache
    st = path.stat()
    path.write_bytes(bytes(bad))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1))  # even a write that leaves the time close
    timings = {}
    path = loader.fetch(m, timings) / "model.onnx"
    assert timings["fetch"] > 0.0, "fetched again"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == m.files[0].sha256

    replaced = path.with_name("other")  # replaced by another file (a new inode), size and bytes equal
    replaced.write_bytes(bytes(bad))
    os.replace(replaced, path)
    timings = {}
    path = loader.fetch(m, timings) / "model.onnx"
    assert timings["fetch"] > 0.0 and path.read_bytes() == good
