"""ModelStreamInfer through a router (real processes: the shared cluster and a router of this module's own),
driven by Triton's client library: answers matched by request id, a failed request answered on the stream
while later ones still succeed, a refused stream, the stream's deadline, cancellation, and load."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import grpc
import numpy as np
import pytest

from ground.wire import REASON, STATUS
from tests import triton_stream
from tests.router.conftest import IN_DIM, auth, infer_request
from tests.router.router_proc import RouterProc


def _gauge(r: RouterProc, name: str) -> float:
    for line in r.metrics_text().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return -1.0


def _wait(pred, timeout: float = 20.0, what: str = "") -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def router(cluster, tmp_path_factory):
    r = RouterProc(tmp_path_factory.mktemp("stream-router"), cluster.router_args(), cluster.env)
    _wait(lambda: _gauge(r, "mmhost_router_hosts_up") == len(cluster.alive()), what="router sees every hostd")
    r.stub.ModelInfer(infer_request("mlp"), metadata=auth(cluster.keys["acme"]), timeout=60)  # loaded somewhere
    yield r
    r.stop()


@pytest.fixture(scope="module")
def want(cluster):
    import onnxruntime as ort

    x = np.arange(2 * IN_DIM, dtype=np.float32).reshape(2, IN_DIM) / (2 * IN_DIM)
    sess = ort.InferenceSession(str(cluster.workdir / "acme.onnx"), providers=["CPUExecutionProvider"])
    return sess.run(["output"], {"input": x})[0]


def _close(ys, want) -> None:
    for y in ys:
        np.testing.assert_allclose(np.array(y), want, rtol=1e-5, atol=1e-5)


def test_triton_stream_answers_every_request_by_id(router, cluster, want):
    out = triton_stream.run(router.addr, "stream", dim=IN_DIM, key=cluster.keys["acme"], models=["mlp"] * 8)
    assert out["errors"] == [] and sorted(out["results"]) == sorted(f"r{k}" for k in range(8))
    _close(out["results"].values(), want)


def test_an_unknown_model_fails_its_request_only(router, cluster, want):
    models = ["mlp", "mlp", "no_such_model", "mlp", "mlp"]
    out = triton_stream.run(router.addr, "stream", dim=IN_DIM, key=cluster.keys["acme"], models=models)
    assert sorted(out["results"]) == ["r0", "r1", "r3", "r4"]
    _close(out["results"].values(), want)
    assert out["errors"] == [["None", "model 'no_such_model' not found"]]


def test_another_tenants_model_is_answered_like_a_missing_one(router, cluster):
    key = cluster.keys["acme"]
    secret = triton_stream.run(router.addr, "stream", dim=IN_DIM, key=key, models=["secret"])["errors"]
    missing = triton_stream.run(router.addr, "stream", dim=IN_DIM, key=key, models=["nosuch"])["errors"]
    assert secret == [["None", "model 'secret' not found"]] and missing == [["None", "model 'nosuch' not found"]]


def test_a_failed_request_carries_its_id_and_status_as_parameters(router, cluster):
    reqs = [infer_request("mlp", request_id="a"), infer_request("no_such_model", request_id="b")]
    got = {r.infer_response.id: r for r in router.stub.ModelStreamInfer(iter(reqs), metadata=auth(cluster.keys["acme"]),
                                                                        timeout=30)}
    assert not got["a"].error_message and list(got["a"].infer_response.outputs[0].shape) == [1, 4]
    b = got["b"].infer_response
    assert got["b"].error_message and b.model_name == "no_such_model"
    assert b.parameters[STATUS].string_param == "NOT_FOUND" and b.parameters[REASON].string_param


def test_a_stream_without_an_api_key_is_refused_unauthenticated(router, cluster):
    out = triton_stream.run(router.addr, "refused", dim=IN_DIM, model="mlp")
    assert out["error"][0] == "StatusCode.UNAUTHENTICATED"
    with pytest.raises(grpc.RpcError) as e:
        list(router.stub.ModelStreamInfer(iter([infer_request("mlp")]), timeout=10))
    assert e.value.code() is grpc.StatusCode.UNAUTHENTICATED
    assert dict(e.value.trailing_metadata() or ())[REASON]


def test_asyncio_client_streams(router, cluster, want):
    out = triton_stream.run(router.addr, "aio", dim=IN_DIM, key=cluster.keys["acme"], model="mlp", n=20, streams=2)
    for s, st in enumerate(out["streams"]):
        assert st["errors"] == [] and sorted(st["results"]) == sorted(f"s{s}-{k}" for k in range(20))
        _close(st["results"].values(), want)


def test_a_stream_past_its_deadline_ends_deadline_exceeded(router, cluster):
    out = triton_stream.run(router.addr, "deadline", dim=IN_DIM, key=cluster.keys["acme"], model="mlp",
                            stream_timeout=1.0)
    assert sorted(out["got"][:3]) == ["r0", "r1", "r2"]
    assert out["got"][-1][0] == "StatusCode.DEADLINE_EXCEEDED"
    assert len(out["unary"]) == 2  # the router still serves


def test_a_cancelled_stream_leaves_router_and_hosts_serving(router, cluster, want):
    hosts = len(cluster.alive())
    start = router.log_path.stat().st_size
    out = triton_stream.run(router.addr, "cancel", dim=IN_DIM, key=cluster.keys["acme"], model="mlp", n=300,
                            wait=0.02)
    _close([out["unary"]], want)
    _wait(lambda: _gauge(router, "mmhost_router_admitted_inflight") == 0, what="no request left admitted")
    assert _gauge(router, "mmhost_router_hosts_up") == hosts
    with open(router.log_path, "rb") as f:
        f.seek(start)
        assert b"Traceback" not in f.read()


def test_streaming_load(router, cluster, want):
    out = triton_stream.run(router.addr, "load", dim=IN_DIM, key=cluster.keys["acme"], model="mlp", n=50, streams=4,
                            timeout=180)
    for st in out["streams"]:
        assert st["errors"] == [] and len(st["results"]) == 50
        _close(st["results"].values(), want)


@pytest.mark.parametrize("size", [0, 1, 127, 128, 20_000, 3_000_000])
def test_a_forwarded_answer_is_wrapped_without_decoding(size):
    from protos import grpc_service_pb2 as pb
    from router.streaming import wrap_response

    resp = pb.ModelInferResponse(model_name="m", id="x", raw_output_contents=[b"\x01" * size] if size else [])
    got = pb.ModelStreamInferResponse.FromString(wrap_response(resp.SerializeToString()))
    assert got.infer_response == resp and not got.error_message


def _perf_analyzer() -> str | None:
    """perf_analyzer when it can run here (it ships with tritonclient but needs libb64 and libcudart)."""
    exe = shutil.which("perf_analyzer") or str(Path(sys.executable).parent / "perf_analyzer")
    try:
        p = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return None if "error while loading shared libraries" in p.stderr else exe


def test_perf_analyzer_streaming(router, cluster):
    exe = _perf_analyzer()
    if exe is None:
        pytest.skip("perf_analyzer cannot run here (missing shared libraries)")
    p = subprocess.run([exe, "-m", "mlp", "-u", router.addr, "-i", "grpc", "--streaming", "-H",
                        f"authorization:Bearer {cluster.keys['acme']}", "--concurrency-range", "4",
                        "--measurement-mode", "count_windows", "--measurement-request-count", "100",
                        "--stability-percentage", "1000", "--max-trials", "3"],  # a busy test machine is not stable
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    assert "Throughput" in p.stdout
