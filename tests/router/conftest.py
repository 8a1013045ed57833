"""A small cluster shared by the router tests: models for two tenants in S3 (moto_server), three hostd
processes heartbeating to a real redis-server, tenants in Redis, and helpers to call a router the way a
tenant does. Every key prefix is unique to this session's cluster."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from catalog.index import connect_redis
from mmhost.demo_models import build_onnx_mlp, onnx_manifest
from ground.settings import S3Settings
from protos import grpc_service_pb2 as pb
from router.tenants import RedisTenants
from storage_adapters import open_storage
from catalog.publish import publish_version
from catalog.repository import ModelRepository
from tests.hostd_proc import HostdProc
from tests.storage.conftest import make_bucket

ACME_MODELS = [f"m{i:02d}" for i in range(12)]
SPARE_MODELS = [f"spare{i:02d}" for i in range(24)]  # never requested before a new hostd joins
IN_DIM = 8


@dataclass
class Cluster:
    store: str
    workdir: Path
    env: dict[str, str]
    redis_url: str
    prefixes: dict[str, str]
    keys: dict[str, str]
    hostds: list[HostdProc] = field(default_factory=list)

    def start_hostd(self) -> HostdProc:
        h = HostdProc(self.store, self.workdir, env=self.env, args=["--redis", self.redis_url], tenant="nobody")
        self.hostds.append(h)
        return h

    def alive(self) -> list[HostdProc]:
        return [h for h in self.hostds if h.proc.poll() is None]

    def router_args(self) -> list[str]:
        return ["--redis", self.redis_url, "--store", self.store, "--refresh-interval", "0.2"]

    def resident(self) -> dict[str, dict[tuple[str, str], str]]:
        """address -> (tenant, model) -> state, for every live hostd."""
        return {h.addr: {(m.tenant, m.model): m.state for m in h.status().models} for h in self.alive()}


@pytest.fixture(scope="session")
def cluster(tmp_path_factory, redis_server, s3_server):
    work = tmp_path_factory.mktemp("router-cluster")
    s3 = S3Settings(endpoint_url=s3_server.endpoint)
    store = f"s3://{make_bucket(s3_server.endpoint)}/store"
    repo = ModelRepository(open_storage(store, s3))
    build_onnx_mlp(work / "acme.onnx", (IN_DIM, 16, 4))
    build_onnx_mlp(work / "globex.onnx", (IN_DIM, 16, 3), seed=1)
    for name in [*ACME_MODELS, *SPARE_MODELS, "mlp"]:
        publish_version(repo, onnx_manifest("acme", name, "1", work / "acme.onnx", "model.onnx"),
                        {"model.onnx": work / "acme.onnx"})
    for name in ("mlp", "secret"):
        publish_version(repo, onnx_manifest("globex", name, "1", work / "globex.onnx", "model.onnx"),
                        {"model.onnx": work / "globex.onnx"})
    tag = uuid.uuid4().hex[:8]
    prefixes = {"hosts": f"t{tag}:hosts:", "tenants": f"t{tag}:tenants:", "catalog": f"t{tag}:catalog:"}
    env = {
        "MMHOST_S3_ENDPOINT_URL": s3_server.endpoint,
        "MMHOST_HOSTD_HEARTBEAT_PREFIX": prefixes["hosts"],
        "MMHOST_HOSTD_HEARTBEAT_INTERVAL_S": "0.2",
        "MMHOST_HOSTD_HEARTBEAT_TTL_S": "1.5",
        "MMHOST_ROUTER_HEARTBEAT_PREFIX": prefixes["hosts"],
        "MMHOST_ROUTER_TENANTS_PREFIX": prefixes["tenants"],
        "MMHOST_ROUTER_CATALOG_PREFIX": prefixes["catalog"],
    }
    reg = RedisTenants(connect_redis(redis_server.url), prefixes["tenants"])
    keys = {t: reg.create(t) for t in ("acme", "globex")}
    c = Cluster(store, work, env, redis_server.url, prefixes, keys)
    with ThreadPoolExecutor(3) as ex:
        list(ex.map(lambda _: c.start_hostd(), range(3)))
    yield c
    for h in c.hostds:
        h.stop()


def infer_request(model: str, rows: int = 1, request_id: str = "") -> pb.ModelInferRequest:
    x = np.random.default_rng(0).random((rows, IN_DIM), dtype=np.float32)
    return pb.ModelInferRequest(
        model_name=model, id=request_id,
        inputs=[pb.ModelInferRequest.InferInputTensor(name="input", datatype="FP32", shape=[rows, IN_DIM])],
        raw_input_contents=[x.tobytes()],
    )


def auth(key: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {key}"),)
