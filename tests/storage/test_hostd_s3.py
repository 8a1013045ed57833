"""End to end through S3: `mmhost upload` to a real moto_server, `mmhost hostd --store s3://...` serving it;
corrupt objects refused by name while other models serve; storage stopped while resident models serve."""

from __future__ import annotations

import time

import grpc
import numpy as np
import onnxruntime as ort
import pytest

from ground.settings import S3Settings
from protos import grpc_service_pb2 as pb
from storage_adapters.s3 import S3Storage
from tests.hostd_proc import HostdProc
from tests.servers import MotoServer
from tests.storage.conftest import make_bucket

FAST_FAIL_S = 15.0


def infer(h: HostdProc, model: str, x: np.ndarray, name: str = "input", timeout: float = 60):
    r = pb.ModelInferRequest(model_name=model)
    r.inputs.add(name=name, datatype="FP32", shape=list(x.shape))
    r.raw_input_contents.append(x.tobytes())
    resp = h.stub.ModelInfer(r, timeout=timeout)
    o = resp.outputs[0]
    return np.frombuffer(resp.raw_output_contents[0], np.float32).reshape(list(o.shape))


def reference(path, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(["output"], {"input": x})[0]


def upload(cli, store: str, model: str, path) -> None:
    r = cli("upload", "--store", store, "--tenant", "demo", "--model", model, path)
    assert r.exit_code == 0, r.output


def model_states(h: HostdProc) -> dict[str, tuple[str, str]]:
    return {m.model: (m.state, m.reason) for m in h.status().models}


def test_upload_and_serve_through_s3_and_refuse_corrupt_objects(cli, s3_server, demo_files, tmp_path):
    store = f"s3://{make_bucket(s3_server.endpoint)}/models"
    for model in ("good", "flipped", "truncated", "substituted"):
        upload(cli, store, model, demo_files / "mlp.onnx")
    s3 = S3Storage.from_uri(store, S3Settings(endpoint_url=s3_server.endpoint))
    key = "tenants/demo/models/{}/1/model.onnx"
    data = s3.read_bytes(key.format("flipped"))
    s3.put_bytes(key.format("flipped"), data[:1000] + bytes([data[1000] ^ 0xFF]) + data[1001:])  # same size
    s3.put_bytes(key.format("truncated"), data[: len(data) // 2])
    s3.put_bytes(key.format("substituted"), (demo_files / "mlp2.onnx").read_bytes())  # a valid model, not this one

    h = HostdProc(store, tmp_path / "hostd", env={"MMHOST_S3_ENDPOINT_URL": s3_server.endpoint})
    try:
        x = np.random.default_rng(0).random((3, 64), dtype=np.float32)
        np.testing.assert_allclose(infer(h, "good", x), reference(demo_files / "mlp.onnx", x), rtol=1e-5, atol=1e-5)

        for model, cause in [("flipped", "sha256"), ("truncated", "bytes"), ("substituted", "sha256")]:
            with pytest.raises(grpc.RpcError) as ei:
                infer(h, model, x)
            details = ei.value.details()
            assert ei.value.code() == grpc.StatusCode.UNAVAILABLE, details
            assert f"model '{model}'" in details and "version '1'" in details and "'model.onnx'" in details, details
            assert cause in details, details
            # the first answer, to the caller that waited on the load, already says when to come back
            assert int(dict(ei.value.trailing_metadata() or ())["retry-after-ms"]) > 0
            state, reason = model_states(h)[model]
            assert state == "FAILED", (model, state, reason)
            # within the retry backoff the model stays refused, with the same cause
            with pytest.raises(grpc.RpcError) as again:
                infer(h, model, x)
            assert again.value.code() == grpc.StatusCode.UNAVAILABLE and "model.onnx" in again.value.details()
            assert dict(again.value.trailing_metadata() or ()).get("retry-after-ms")

        # everything else keeps serving
        np.testing.assert_allclose(infer(h, "good", x), reference(demo_files / "mlp.onnx", x), rtol=1e-5, atol=1e-5)
        assert model_states(h)["good"][0] == "READY"
        # nothing corrupt was left in the disk cache under a model file's name
        assert not list((tmp_path / "hostd").glob("cache-*/demo/flipped/1/model.onnx"))
    finally:
        h.stop()


def test_storage_stopped_while_resident_models_keep_serving(cli, demo_files, tmp_path):
    srv = MotoServer()  # our own: this test stops it
    h = None
    try:
        store = f"s3://{make_bucket(srv.endpoint)}/models"
        from typer.testing import CliRunner

        from mmhost.cli import app

        for model in ("resident", "cold"):
            r = CliRunner().invoke(app, ["upload", "--store", store, "--tenant", "demo", "--model", model,
                                         str(demo_files / "mlp.onnx"), "--s3-endpoint", srv.endpoint])
            assert r.exit_code == 0, r.output
        h = HostdProc(store, tmp_path / "hostd", env={"MMHOST_S3_ENDPOINT_URL": srv.endpoint})
        x = np.random.default_rng(1).random((2, 64), dtype=np.float32)
        want = reference(demo_files / "mlp.onnx", x)
        np.testing.assert_allclose(infer(h, "resident", x), want, rtol=1e-5, atol=1e-5)

        srv.stop()
        t0 = time.monotonic()
        with pytest.raises(grpc.RpcError) as ei:
            infer(h, "cold", x, timeout=60)
        assert time.monotonic() - t0 < FAST_FAIL_S
        assert ei.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "storage" in ei.value.details(), ei.value.details()
        # the tenant is told storage is down, never where it lives; the operator's log names it
        assert srv.endpoint not in ei.value.details() and "models" not in ei.value.details(), ei.value.details()
        assert dict(ei.value.trailing_metadata() or ()).get("mmhost-reason") == "storage_down"
        assert srv.endpoint in h.log()

        for _ in range(20):  # the resident model serves throughout, storage or not
            np.testing.assert_allclose(infer(h, "resident", x, timeout=10), want, rtol=1e-5, atol=1e-5)
    finally:
        if h is not None:
            h.stop()
        if srv.proc.poll() is None:
            srv.stop()


def test_an_emptied_bucket_never_makes_a_loaded_model_not_found(cli, s3_server, demo_files, tmp_path):
    """A bucket restarted empty (or a half-restored one) lists no versions: a model resident on the hostd
    keeps serving through it; a model that is not resident follows storage (NOT_FOUND)."""
    store = f"s3://{make_bucket(s3_server.endpoint)}/models"
    for model in ("resident", "cold"):
        upload(cli, store, model, demo_files / "mlp.onnx")
    h = HostdProc(store, tmp_path / "hostd", env={"MMHOST_S3_ENDPOINT_URL": s3_server.endpoint})
    try:
        x = np.random.default_rng(2).random((2, 64), dtype=np.float32)
        want = reference(demo_files / "mlp.onnx", x)
        np.testing.assert_allclose(infer(h, "resident", x), want, rtol=1e-5, atol=1e-5)
        s3 = S3Storage.from_uri(store, S3Settings(endpoint_url=s3_server.endpoint))
        for obj in list(s3.list("")):
            s3.delete(obj.key)
        deadline = time.monotonic() + 5.0  # past the catalog view's TTL (2 s): refreshes see an empty bucket
        while time.monotonic() < deadline:
            np.testing.assert_allclose(infer(h, "resident", x, timeout=10), want, rtol=1e-5, atol=1e-5)
        with pytest.raises(grpc.RpcError) as ei:
            infer(h, "cold", x)
        assert ei.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        h.stop()
