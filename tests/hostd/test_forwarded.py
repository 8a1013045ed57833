"""HostdData.Infer on a real hostd: a router's ModelInfer calls, many to a stream (hostd/forwarded.py). Each call
is answered once by its seq, as a unary ModelInfer would answer it: the same output, and on failure the same
status code and trailers; a failed call leaves the stream going; a message that is not frames ends the stream.
A message carries one call or several."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from ground.forwarded import METHOD, decode_answer, encode_call, frames, join
from ground.wire import REASON, REQUEST_ID, SERVED
from protos import grpc_service_pb2 as pb

DIM = 64


def _body(model: str, x: np.ndarray | None = None, **params: int) -> bytes:
    x = np.ones((1, DIM), dtype=np.float32) if x is None else x
    req = pb.ModelInferRequest(model_name=model, id=f"id-{model}", raw_input_contents=[x.tobytes()], inputs=[
        pb.ModelInferRequest.InferInputTensor(name="input", datatype="FP32", shape=list(x.shape))])
    for k, v in params.items():
        req.parameters[k].int64_param = v
    return req.SerializeToString()


def _stream(hostd, calls: list[bytes], batch: bool = False) -> dict[int, tuple]:
    """Send `calls` one to a message (or all in one, `batch`); the answers by seq."""
    call = hostd.channel.stream_stream(METHOD)
    out = {}
    for message in call(iter([join(calls)] if batch else [join([c]) for c in calls]), timeout=60):
        for raw in frames(message):
            head, resp = decode_answer(raw)
            assert head.seq not in out, "each call is answered once"
            out[head.seq] = (head, bytes(resp))
    return out


@pytest.mark.parametrize("batch", [False, True])
def test_calls_are_answered_by_seq_as_unary_calls_are(hostd, batch):
    x = np.random.default_rng(3).random((1, DIM), dtype=np.float32)
    unary = hostd.stub.ModelInfer(pb.ModelInferRequest.FromString(_body("mlp", x)), timeout=30)
    got = _stream(hostd, [encode_call(s, "demo", 0, _body("mlp", x)) for s in (5, 9, 7)], batch)
    assert sorted(got) == [5, 7, 9]
    for head, resp in got.values():
        assert head.code == 0 and not head.message
        r = pb.ModelInferResponse.FromString(resp)
        assert r.id == "id-mlp" and r.model_name == "mlp"
        np.testing.assert_allclose(np.frombuffer(r.raw_output_contents[0], np.float32),  # batched: rounding
                                   np.frombuffer(unary.raw_output_contents[0], np.float32), rtol=1e-4, atol=1e-5)
        trailers = {t.key: t.value for t in head.trailers}
        assert trailers[SERVED].startswith("v=1;")  # what the router's access log reads off a unary call


def test_a_failed_call_gets_the_unary_status_and_trailers_and_the_stream_goes_on(hostd):
    calls = [encode_call(1, "demo", 0, _body("nope")), encode_call(2, "demo", 0, b"\xff\xff not protobuf"),
             encode_call(3, "demo", 0, _body("mlp"))]
    got = _stream(hostd, calls, batch=True)
    with pytest.raises(grpc.RpcError) as unary:
        hostd.stub.ModelInfer(pb.ModelInferRequest.FromString(_body("nope")), timeout=30)
    head = got[1][0]
    assert head.code == unary.value.code().value[0] == grpc.StatusCode.NOT_FOUND.value[0]
    trailers = {t.key: t.value for t in head.trailers}
    unary_trailers = dict(unary.value.trailing_metadata())
    assert trailers[REASON] == unary_trailers[REASON] and trailers[REQUEST_ID]
    assert head.message.split(" (request id")[0] == unary.value.details().split(" (request id")[0]
    assert got[2][0].code == grpc.StatusCode.INVALID_ARGUMENT.value[0] and "malformed" in got[2][0].message
    assert got[3][0].code == 0 and pb.ModelInferResponse.FromString(got[3][1]).outputs[0].name == "output"


def test_another_tenants_model_is_not_found_as_a_missing_one(hostd):
    got = _stream(hostd, [encode_call(1, "someone-else", 0, _body("mlp")), encode_call(2, "someone-else", 0, _body("nope"))])
    (a, _), (b, _) = got[1], got[2]
    assert a.code == b.code == grpc.StatusCode.NOT_FOUND.value[0]
    assert a.message.replace("mlp", "X").split(" (request id")[0] == b.message.replace("nope", "X").split(" (request id")[0]


def test_the_frames_time_left_is_the_calls_deadline(hostd):
    """1 us left: hostd refuses the call DEADLINE_EXCEEDED with its reason, as it would a unary call whose
    deadline passed; a call with no time limit on the same stream is served."""
    got = _stream(hostd, [encode_call(1, "demo", 1, _body("mlp_big", np.ones((1, DIM), np.float32))),
                          encode_call(2, "demo", 0, _body("mlp"))])
    head = got[1][0]
    assert head.code == grpc.StatusCode.DEADLINE_EXCEEDED.value[0]
    assert {t.key for t in head.trailers} >= {REASON, REQUEST_ID}
    assert got[2][0].code == 0


@pytest.mark.parametrize("message", [b"\x0f\x0f\x0f", join([b"\x0f\x0f\x0f"]), join([b"x"]) + b"\x10\x01"])
def test_a_message_that_is_not_frames_ends_the_stream_invalid_argument(hostd, message):
    call = hostd.channel.stream_stream(METHOD)
    with pytest.raises(grpc.RpcError) as e:
        list(call(iter([message]), timeout=30))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert dict(e.value.trailing_metadata())[REASON]
    assert hostd.stub.ModelInfer(pb.ModelInferRequest.FromString(_body("mlp")), timeout=30).outputs
