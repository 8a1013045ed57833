"""A demo store and one hostd process shared by the hostd integration tests."""

from __future__ import annotations

import pytest

from mmhost.demo_models import build_onnx_mlp, onnx_manifest, seed_store
from ground.manifest import DynamicBatching
from storage_adapters.local import LocalStorage
from catalog.publish import publish_version
from catalog.repository import ModelRepository
from tests.hostd_proc import HostdProc


@pytest.fixture(scope="session")
def demo_store(tmp_path_factory):
    root = tmp_path_factory.mktemp("store")
    seed_store(root)
    repo = ModelRepository(LocalStorage(root))
    work = tmp_path_factory.mktemp("models")
    # compute-heavy enough (~1 ms a pass) that requests queue up while the executor is busy
    build_onnx_mlp(work / "big.onnx", (64, 2048, 2048, 10))
    publish_version(repo, onnx_manifest("demo", "mlp_big", "1", work / "big.onnx", "model.onnx"), {"model.onnx": work / "big.onnx"})
    m = onnx_manifest("demo", "mlp_nobatch", "1", work / "big.onnx", "model.onnx").model_copy(update={"max_batch_size": 0})
    publish_version(repo, m, {"model.onnx": work / "big.onnx"})
    prio = onnx_manifest("demo", "mlp_prio", "1", work / "big.onnx", "model.onnx").model_copy(
        update={"max_batch_size": 32, "dynamic_batching": DynamicBatching(priority_levels=2, default_priority_level=2)}
    )
    publish_version(repo, prio, {"model.onnx": work / "big.onnx"})
    (root / "tenants/demo/models/broken/1").mkdir(parents=True)  # files but no manifest: invisible
    (root / "tenants/demo/models/broken/1/model.onnx").write_bytes(b"not a model")
    return root


@pytest.fixture(scope="session")
def hostd(demo_store, tmp_path_factory):
    h = HostdProc(str(demo_store), tmp_path_factory.mktemp("hostd"), env={"MMHOST_HOSTD_MAX_REQUEST_BYTES": str(1 << 20)})
    yield h
    h.stop()
