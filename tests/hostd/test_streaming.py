"""ModelStreamInfer on a hostd directly (Triton's tools pointed at a hostd): each request answered once, by id;
a failed request answered on the stream with its status in parameters while the stream goes on; a cancelled
stream leaves the host serving."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from ground.wire import REASON, STATUS
from protos import grpc_service_pb2 as pb
from tests import triton_stream

DIM = 64


@pytest.fixture(scope="module")
def want(demo_store):
    import onnxruntime as ort

    x = np.arange(2 * DIM, dtype=np.float32).reshape(2, DIM) / (2 * DIM)
    sess = ort.InferenceSession(str(demo_store / "tenants/demo/models/mlp/1/model.onnx"),
                                providers=["CPUExecutionProvider"])
    return sess.run(["output"], {"input": x})[0]


def _request(model: str, rid: str) -> pb.ModelInferRequest:
    x = np.ones((1, DIM), dtype=np.float32)
    return pb.ModelInferRequest(model_name=model, id=rid, raw_input_contents=[x.tobytes()], inputs=[
        pb.ModelInferRequest.InferInputTensor(name="input", datatype="FP32", shape=[1, DIM])])


def test_triton_stream_answers_each_request_by_id_and_a_missing_model_only_fails_its_request(hostd, want):
    models = ["mlp", "mlp", "nope", "mlp", "mlp"]
    out = triton_stream.run(hostd.addr, "stream", dim=DIM, models=models)
    assert sorted(out["results"]) == ["r0", "r1", "r3", "r4"]
    for y in out["results"].values():
        np.testing.assert_allclose(np.array(y), want, rtol=1e-5, atol=1e-5)
    assert len(out["errors"]) == 1 and "nope" in out["errors"][0][1]


def test_a_failed_request_carries_its_id_and_status_as_parameters(hostd):
    reqs = [_request("mlp", "a"), _request("nope", "b"), _request("mlp", "c")]
    got = {r.infer_response.id: r for r in hostd.stub.ModelStreamInfer(iter(reqs), timeout=30)}
    assert sorted(got) == ["a", "b", "c"]
    assert not got["a"].error_message and got["a"].infer_response.outputs[0].name == "output"
    b = got["b"]
    assert b.error_message and b.infer_response.model_name == "nope"
    assert b.infer_response.parameters[STATUS].string_param == "NOT_FOUND"
    assert b.infer_response.parameters[REASON].string_param


def test_asyncio_client_streams(hostd, want):
    out = triton_stream.run(hostd.addr, "aio", dim=DIM, model="mlp", n=20, streams=2)
    for s, st in enumerate(out["streams"]):
        assert st["errors"] == [] and sorted(st["results"]) == sorted(f"s{s}-{k}" for k in range(20))
        for y in st["results"].values():
            np.testing.assert_allclose(np.array(y), want, rtol=1e-5, atol=1e-5)


def test_a_cancelled_stream_leaves_the_host_serving(hostd, want):
    start = hostd.log_path.stat().st_size
    out = triton_stream.run(hostd.addr, "cancel", dim=DIM, model="mlp_big", n=200)
    np.testing.assert_allclose(np.array(triton_stream.run(hostd.addr, "stream", dim=DIM, models=["mlp"])["results"]["r0"]),
                               want, rtol=1e-5, atol=1e-5)
    assert len(out["unary"]) == 2
    with open(hostd.log_path, "rb") as f:
        f.seek(start)
        assert b"Traceback" not in f.read()


def test_a_stream_past_its_deadline_ends_deadline_exceeded(hostd):
    out = triton_stream.run(hostd.addr, "deadline", dim=DIM, model="mlp", stream_timeout=1.0)
    assert out["got"][:3] == ["r0", "r1", "r2"] or sorted(out["got"][:3]) == ["r0", "r1", "r2"]
    assert out["got"][-1][0] == "StatusCode.DEADLINE_EXCEEDED"
    assert len(out["unary"]) == 2


def test_raw_stream_deadline_is_a_status(hostd):
    import threading

    held = threading.Event()

    def slow():
        yield _request("mlp", "a")
        held.wait(10)  # the client keeps the stream open past its deadline; released when the test is done

    try:
        with pytest.raises(grpc.RpcError) as e:
            list(hostd.stub.ModelStreamInfer(slow(), timeout=0.5))
        assert e.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    finally:
        held.set()


def test_a_message_that_cannot_be_decoded_fails_alone(hostd):
    call = hostd.channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
    bodies = [_request("mlp", "a").SerializeToString(), b"\xff\xff\xff", _request("mlp", "c").SerializeToString()]
    got = [pb.ModelStreamInferResponse.FromString(b) for b in call(iter(bodies), timeout=30)]
    assert sorted(r.infer_response.id for r in got if not r.error_message) == ["a", "c"]
    bad = [r for r in got if r.error_message]
    assert len(bad) == 1 and bad[0].infer_response.parameters[STATUS].string_param == "INVALID_ARGUMENT"
