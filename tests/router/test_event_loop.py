"""The event loop each process runs (ground/eventloop.py), on real processes: `mmhost router` runs on uvloop
unless told asyncio, `mmhost hostd` on asyncio unless told uvloop, and each says so in its start line. A call
through a router on either loop, to a hostd on either loop, gets the model's own answer (ONNX Runtime's, run
here), over the host's data link (the asyncio streams uvloop compiles: a connection to its data port is open) with
no stream failed or fallen back to gRPC."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from catalog.publish import publish_version
from catalog.repository import ModelRepository
from mmhost.demo_models import build_onnx_mlp, onnx_manifest
from router.tenants import FileTenants
from storage_adapters.local import LocalStorage
from tests.hostd_proc import HostdProc, metric_value
from tests.router.conftest import IN_DIM, auth, infer_request
from tests.router.router_proc import RouterProc

pytestmark = pytest.mark.timeout(120)


def answer(r: RouterProc, key: str) -> np.ndarray:
    out = r.stub.ModelInfer(infer_request("m", rows=3), metadata=auth(key), timeout=30)
    return np.frombuffer(out.raw_output_contents[0], dtype=np.float32)


def test_each_process_runs_the_loop_it_is_set_to_and_answers_the_same(tmp_path):
    build_onnx_mlp(tmp_path / "m.onnx", (IN_DIM, 16, 4))
    publish_version(ModelRepository(LocalStorage(tmp_path / "store")),
                    onnx_manifest("t", "m", "1", tmp_path / "m.onnx", "model.onnx"), {"model.onnx": tmp_path / "m.onnx"})
    key = FileTenants(tmp_path / "tenants.json").create("t")
    x = np.random.default_rng(0).random((3, IN_DIM), dtype=np.float32)  # infer_request's rows
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    expected = session.run(None, {session.get_inputs()[0].name: x})[0].ravel()
    procs: list[HostdProc | RouterProc] = []
    try:
        plain_host = HostdProc(str(tmp_path / "store"), tmp_path, tenant="nobody")
        procs.append(plain_host)
        uv_host = HostdProc(str(tmp_path / "store"), tmp_path, tenant="nobody", env={"MMHOST_HOSTD_EVENT_LOOP": "uvloop"})
        procs.append(uv_host)
        assert plain_host.event_loops() == ["asyncio"]
        assert uv_host.event_loops() == ["uvloop"]
        args = ["--tenants", str(tmp_path / "tenants.json"), "--store", str(tmp_path / "store")]
        routers = []
        for host, env in ((uv_host, {}), (uv_host, {"MMHOST_ROUTER_EVENT_LOOP": "asyncio"}), (plain_host, {})):
            routers.append(RouterProc(tmp_path, ["--hosts", host.addr, *args], env=env))
            procs.append(routers[-1])
        assert [r.event_loops() for r in routers] == [["uvloop"], ["asyncio"], ["uvloop"]]
        for r in routers:
            np.testing.assert_allclose(answer(r, key), expected, rtol=1e-5, atol=1e-6)
        for r, host in zip(routers, (uv_host, uv_host, plain_host), strict=True):  # on the host's data link, none failed
            assert r.data_links(host) >= 1
            assert metric_value(r.metrics_text(), "mmhost_router_hostd_stream_ends_total") == 0
    finally:
        for p in reversed(procs):
            p.stop()
