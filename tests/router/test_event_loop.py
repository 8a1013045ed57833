"""The event loop each process runs (ground/eventloop.py), on real processes: `mmhost router` runs on uvloop
unless told asyncio, `mmhost hostd` on asyncio unless told uvloop, each says so in its start line, and a call
through either router to a hostd on uvloop (over the router's data link, the asyncio streams uvloop compiles)
gets the model's own answer."""

from __future__ import annotations

import re

import numpy as np
import pytest

from catalog.publish import publish_version
from catalog.repository import ModelRepository
from mmhost.demo_models import build_onnx_mlp, onnx_manifest
from router.tenants import FileTenants
from storage_adapters.local import LocalStorage
from tests.hostd_proc import HostdProc, metric_value
from tests.router.conftest import IN_DIM, auth, infer_request
from tests.router.router_proc import RouterProc
from tests.router.test_cluster import wait_until

pytestmark = pytest.mark.timeout(120)


def loop_of(proc: HostdProc | RouterProc, role: str) -> str:
    """The event loop `proc` said it serves on, from its start line."""
    m = re.search(rf"{role} serving on .*event loop (\w+)\)", proc.log_path.read_text(errors="replace"))
    assert m, f"no start line in {proc.log_path}:\n{proc.log()}"
    return m.group(1)


def answer(r: RouterProc, key: str) -> np.ndarray:
    out = r.stub.ModelInfer(infer_request("m", rows=3), metadata=auth(key), timeout=30)
    return np.frombuffer(out.raw_output_contents[0], dtype=np.float32)


def test_each_process_runs_the_loop_it_is_set_to_and_answers_the_same(tmp_path):
    build_onnx_mlp(tmp_path / "m.onnx", (IN_DIM, 16, 4))
    publish_version(ModelRepository(LocalStorage(tmp_path / "store")),
                    onnx_manifest("t", "m", "1", tmp_path / "m.onnx", "model.onnx"), {"model.onnx": tmp_path / "m.onnx"})
    key = FileTenants(tmp_path / "tenants.json").create("t")
    plain_host = HostdProc(str(tmp_path / "store"), tmp_path, tenant="nobody")
    uv_host = HostdProc(str(tmp_path / "store"), tmp_path, tenant="nobody", env={"MMHOST_HOSTD_EVENT_LOOP": "uvloop"})
    routers: list[RouterProc] = []
    try:
        assert loop_of(plain_host, "hostd") == "asyncio"
        assert loop_of(uv_host, "hostd") == "uvloop"
        args = ["--tenants", str(tmp_path / "tenants.json"), "--store", str(tmp_path / "store")]
        routers = [RouterProc(tmp_path, ["--hosts", uv_host.addr, *args]),
                   RouterProc(tmp_path, ["--hosts", uv_host.addr, *args], env={"MMHOST_ROUTER_EVENT_LOOP": "asyncio"}),
                   RouterProc(tmp_path, ["--hosts", plain_host.addr, *args])]
        assert [loop_of(r, "router") for r in routers] == ["uvloop", "asyncio", "uvloop"]
        answers = [answer(r, key) for r in routers]
        assert answers[0].shape == (3 * 4,)
        for a in answers[1:]:
            np.testing.assert_array_equal(a, answers[0])
        for r in routers:  # each call went on a stream over the host's data link, none fell back to gRPC
            wait_until(lambda r=r: metric_value(r.metrics_text(), "mmhost_router_hostd_streams") >= 1, what="a stream")
            assert metric_value(r.metrics_text(), "mmhost_router_hostd_stream_ends_total") == 0
    finally:
        for r in routers:
            r.stop()
        uv_host.stop()
        plain_host.stop()
