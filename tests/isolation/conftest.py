"""One router and one hostd in embedded mode, configured by one tenants file (the router reads keys and
quotas from it, the hostd weights and instance counts), with three tenants:
- noisy (tier free, 20 requests/s, burst 5, 8 in flight) owns `slow`, a compute-heavy MLP;
- light (tier standard) owns `fast`, a small MLP;
- big (tier premium: 2 instances per model) owns `slow` too."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from mmhost.demo_models import build_onnx_mlp, onnx_manifest
from protos import grpc_service_pb2 as pb
from router.tenants import FileTenants
from storage_adapters.local import LocalStorage
from catalog.publish import publish_version
from catalog.repository import ModelRepository
from tests.hostd_proc import HostdProc
from tests.router.router_proc import RouterProc

SLOW_DIMS = (64, 2048, 2048, 10)
FAST_DIMS = (16, 32, 4)
NOISY_QUOTA = {"rate": 20, "burst": 5, "max_concurrency": 8}


@dataclass
class Isolated:
    router: RouterProc
    hostd: HostdProc
    keys: dict[str, str]
    tenants_file: Path
    store: Path
    workdir: Path


def build_store(root: Path, work: Path) -> None:
    repo = ModelRepository(LocalStorage(root))
    build_onnx_mlp(work / "slow.onnx", SLOW_DIMS)
    build_onnx_mlp(work / "fast.onnx", FAST_DIMS)
    for tenant in ("noisy", "big"):
        publish_version(repo, onnx_manifest(tenant, "slow", "1", work / "slow.onnx", "model.onnx"),
                        {"model.onnx": work / "slow.onnx"})
    publish_version(repo, onnx_manifest("light", "fast", "1", work / "fast.onnx", "model.onnx"),
                    {"model.onnx": work / "fast.onnx"})


@pytest.fixture(scope="module")
def isolated(tmp_path_factory):
    work = tmp_path_factory.mktemp("isolation")
    store = work / "store"
    build_store(store, work)
    f = work / "tenants.json"
    reg = FileTenants(f)
    keys = {"noisy": reg.create("noisy", "free", NOISY_QUOTA), "light": reg.create("light", "standard"),
            "big": reg.create("big", "premium")}
    h = HostdProc(str(store), work, args=["--tenant-limits", str(f)], tenant="nobody")
    r = RouterProc(work, ["--hosts", h.addr, "--tenants", str(f), "--store", str(store), "--refresh-interval", "0.2"])
    yield Isolated(r, h, keys, f, store, work)
    r.stop()
    h.stop()


def slow_request(rows: int = 32, timeout_us: int = 0) -> pb.ModelInferRequest:
    x = np.random.default_rng(0).random((rows, SLOW_DIMS[0]), dtype=np.float32)
    r = pb.ModelInferRequest(model_name="slow", inputs=[pb.ModelInferRequest.InferInputTensor(
        name="input", datatype="FP32", shape=[rows, SLOW_DIMS[0]])], raw_input_contents=[x.tobytes()])
    if timeout_us:
        r.parameters["timeout"].int64_param = timeout_us
    return r


def fast_request() -> pb.ModelInferRequest:
    x = np.random.default_rng(1).random((1, FAST_DIMS[0]), dtype=np.float32)
    return pb.ModelInferRequest(model_name="fast", inputs=[pb.ModelInferRequest.InferInputTensor(
        name="input", datatype="FP32", shape=[1, FAST_DIMS[0]])], raw_input_contents=[x.tobytes()])


def auth(key: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {key}"),)
