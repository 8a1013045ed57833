"""A storm of concurrent 8 MiB requests from one tenant beside another tenant's small requests, through a real
router and at a hostd directly, with the shipped byte budgets (router 256 MiB, a tenant a quarter; hostd 512 MiB,
a tenant 32 MiB here): the storm's excess is refused at once with RESOURCE_EXHAUSTED `inflight_bytes` and
retry-after-ms, nothing else fails, the calm tenant's requests all succeed, and a hostd behind the router holds a
fraction of what it held with the budgets off, the router a third of what it reached without a budget. At a hostd
called directly (only routers may, behind mutual TLS) the bodies it receives at once before its handler runs
are not bounded: its peak is printed, not asserted."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import grpc
import numpy as np
import pytest

from bench._tenants import Outcomes
from bench.storms import PeakRss, calm_thread
from bench.storms import storm as send_storm
from catalog.publish import publish_version
from catalog.repository import ModelRepository
from ground.wire import TENANT_HEADER
from mmhost.demo_models import build_onnx_mlp, onnx_manifest
from protos import grpc_service_pb2 as pb
from protos import grpc_service_pb2_grpc
from router.tenants import FileTenants
from storage_adapters.local import LocalStorage
from tests.hostd_proc import HostdProc
from tests.isolation.conftest import FAST_DIMS, auth, fast_request
from tests.router.router_proc import RouterProc

WIDE = (65536, 16, 4)
ROWS = 32  # 32 x 65536 float32 = 8 MiB a request (the default max_batch_size is 32)
MiB = 1 << 20
BIG = [("grpc.max_send_message_length", 256 * MiB), ("grpc.max_receive_message_length", 256 * MiB)]


@dataclass
class Storm:
    router: RouterProc
    hostd: HostdProc
    keys: dict[str, str]


@pytest.fixture(scope="module")
def storm(tmp_path_factory):
    work = tmp_path_factory.mktemp("storm")
    store = work / "store"
    repo = ModelRepository(LocalStorage(store))
    build_onnx_mlp(work / "wide.onnx", WIDE)
    build_onnx_mlp(work / "fast.onnx", FAST_DIMS)
    publish_version(repo, onnx_manifest("stormy", "wide", "1", work / "wide.onnx", "model.onnx"),
                    {"model.onnx": work / "wide.onnx"})
    publish_version(repo, onnx_manifest("calm", "fast", "1", work / "fast.onnx", "model.onnx"),
                    {"model.onnx": work / "fast.onnx"})
    f = work / "tenants.json"
    reg = FileTenants(f)
    keys = {t: reg.create(t, "unlimited") for t in ("stormy", "calm")}
    # the hostd's tenant bound is set lower than the router's, so the direct storm surely passes it
    h = HostdProc(str(store), work, args=["--tenant-limits", str(f)], tenant="nobody",
                  env={"MMHOST_HOSTD_TENANT_INFLIGHT_BYTES": "32MiB"})
    r = RouterProc(work, ["--hosts", h.addr, "--tenants", str(f), "--store", str(store), "--refresh-interval", "0.2"])
    yield Storm(r, h, keys)
    r.stop()
    h.stop()


def wide_request() -> pb.ModelInferRequest:
    x = np.random.default_rng(2).random((ROWS, WIDE[0]), dtype=np.float32)
    return pb.ModelInferRequest(model_name="wide", inputs=[pb.ModelInferRequest.InferInputTensor(
        name="input", datatype="FP32", shape=[ROWS, WIDE[0]])], raw_input_contents=[x.tobytes()])


def _run(storm: Storm, addr: str, stormy_md, calm_md, concurrency: int = 64, seconds: float = 3.0):
    calm_box: list[Outcomes] = []
    rss = PeakRss(storm.router.proc.pid, storm.hostd.proc.pid)
    t = calm_thread(addr, calm_md, seconds + 0.5, calm_box)
    codes, odd, hints = asyncio.run(send_storm(addr, stormy_md, wide_request().SerializeToString(), concurrency, seconds,
                                          timeout=60))
    t.join(30)
    mem = rss.stop()
    calm = calm_box[0]
    print(f"storm {dict(codes)}; calm {dict(calm.codes)} p99 {calm.pct(99):.1f} ms; "
          f"rss MiB (start, peak): router {mem[0]}, hostd {mem[1]}")
    return codes, odd, hints, calm, mem


def test_a_storm_through_the_router_is_cut_to_its_budget_and_the_calm_tenant_is_served(storm):
    r, keys = storm.router, storm.keys
    stormy, calm = auth(keys["stormy"]), auth(keys["calm"])
    r.stub.ModelInfer(fast_request(), metadata=calm, timeout=60)  # both models loaded first
    grpc_service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(r.addr, options=BIG)).ModelInfer(
        wide_request(), metadata=stormy, timeout=60)
    codes, odd, hints, calm_out, mem = _run(storm, r.addr, stormy, calm)
    refused = codes["RESOURCE_EXHAUSTED/inflight_bytes"]
    assert not odd, (odd, dict(codes), mem)
    assert set(codes) <= {"OK", "RESOURCE_EXHAUSTED/inflight_bytes"}, codes
    assert refused > 0 and codes["OK"] > 0 and hints == refused, codes
    # every calm request succeeds; its latency is the CPU's (client, router and hostd share 2 cores), not asserted
    assert calm_out.refused == 0 and calm_out.codes["OK"] >= 1, (calm_out.errors, dict(codes))
    # MiB. Behind the router's budget the hostd holds little (330-400 here; 900 with the budgets off). The router
    # refuses a tenant whose budget has no room for a body the size of its recent ones before reading it, and
    # reads at most stream_window_bytes (1 MiB) of a body it has not asked for: 280-350 MiB here (1.1 GiB with no
    # budget at all, 1.0-1.9 GiB with the budget charged only once bodies were whole, 2 GiB in the chaos run).
    assert mem[1][1] < 700 and mem[0][1] < 768, mem
    assert r.proc.poll() is None and storm.hostd.proc.poll() is None


def test_a_storm_at_a_hostd_directly_is_cut_to_its_budget(storm):
    h = storm.hostd
    stormy, calm = ((TENANT_HEADER, "stormy"),), ((TENANT_HEADER, "calm"),)
    codes, odd, hints, calm_out, mem = _run(storm, h.addr, stormy, calm, concurrency=64, seconds=3.0)
    assert not odd, (odd, dict(codes), mem)
    assert set(codes) <= {"OK", "RESOURCE_EXHAUSTED/inflight_bytes"}, codes
    assert codes["RESOURCE_EXHAUSTED/inflight_bytes"] > 0 and codes["OK"] > 0, codes
    assert calm_out.refused == 0 and calm_out.codes["OK"] >= 1, (calm_out.errors, dict(codes))
    # the hostd's peak is receipt, as at the router (printed): routers in front bound what reaches a hostd
    assert h.proc.poll() is None
