"""hostd/wire_request.py: a large ModelInfer body's raw tensors are read as views into the bytes that
arrived (no copy), with protobuf's meaning and protobuf's refusals; through a real hostd, large requests at
every alignment give the model's own answer."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from google.protobuf.message import DecodeError

from ground.protowire import Malformed, split_bytes_field
from hostd import wire_request
from hostd.wire_request import RAW_FIELD, RAW_INPUTS, SPLIT_FROM, parse_infer_request
from protos import grpc_service_pb2 as pb
from tests.mutations import mutated
from protos import grpc_service_pb2_grpc
from tests.hostd.test_server import local_mlp, out_array


def _request(n: int = 64, ident: str = "req-7") -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(
        model_name="mlp", model_version="2", id=ident,
        inputs=[pb.ModelInferRequest.InferInputTensor(name="a", datatype="UINT8", shape=[1, n]),
                pb.ModelInferRequest.InferInputTensor(name="b", datatype="UINT8", shape=[1, 3])],
        outputs=[pb.ModelInferRequest.InferRequestedOutputTensor(name="out")],
        raw_input_contents=[bytes(range(256)) * (n // 256) + b"x" * (n % 256), b"abc"])
    req.parameters["priority"].int64_param = 1
    return req


def _without_raw(req: pb.ModelInferRequest) -> pb.ModelInferRequest:
    r = pb.ModelInferRequest()
    r.CopyFrom(req)
    r.ClearField("raw_input_contents")
    return r


def test_a_large_body_is_split_into_the_request_and_views_of_its_raw_values():
    req = _request(SPLIT_FROM + 1000)
    body = req.SerializeToString()
    parsed = parse_infer_request(body)
    raw = RAW_INPUTS.get()
    assert raw is not None and [bytes(v) for v in raw] == list(req.raw_input_contents)
    assert all(v.obj is body for v in raw)  # views into the body: nothing copied
    assert parsed == _without_raw(req) and len(parsed.raw_input_contents) == 0


def test_a_small_body_is_parsed_whole():
    req = _request(100)
    assert parse_infer_request(req.SerializeToString()) == req
    assert RAW_INPUTS.get() is None


def test_repeated_and_interleaved_fields_keep_protobufs_meaning():
    a = pb.ModelInferRequest(model_name="first", raw_input_contents=[b"1" * 10])
    b = pb.ModelInferRequest(model_name="last", id="i", raw_input_contents=[b"2" * 20, b""])
    body = a.SerializeToString() + b.SerializeToString()  # concatenation merges; repeated fields append
    full = pb.ModelInferRequest.FromString(body)
    raw, rest = split_bytes_field(body, RAW_FIELD)
    assert [bytes(v) for v in raw] == list(full.raw_input_contents) == [b"1" * 10, b"2" * 20, b""]
    assert pb.ModelInferRequest.FromString(b"".join(rest)) == _without_raw(full)
    # field 7 with another wire type is not a raw value: left to protobuf, which keeps it as an unknown field
    odd = b"\x38\x05" + b.SerializeToString()
    raw, rest = split_bytes_field(odd, RAW_FIELD)
    assert len(raw) == 2 and pb.ModelInferRequest.FromString(b"".join(rest)).model_name == "last"


def test_agrees_with_protobuf_on_mutated_bodies():
    """Random corruptions of a real request: the split accepts exactly what protobuf accepts, with the same
    fields and raw values (a few thousand mutations)."""
    base = _request(300).SerializeToString()
    for body in mutated(base, 3000, 11):
        try:
            full = pb.ModelInferRequest.FromString(body)
        except DecodeError:
            with pytest.raises((Malformed, DecodeError)):
                raw, rest = split_bytes_field(body, RAW_FIELD)
                pb.ModelInferRequest.FromString(b"".join(rest))
            continue
        raw, rest = split_bytes_field(body, RAW_FIELD)
        assert [bytes(v) for v in raw] == list(full.raw_input_contents), body.hex()
        assert pb.ModelInferRequest.FromString(b"".join(rest)) == _without_raw(full), body.hex()


def test_a_truncated_large_body_is_a_decode_error():
    body = _request(SPLIT_FROM + 10).SerializeToString()
    cuts = (body[:-1], body[: SPLIT_FROM + 5], body + b"\x3a\x80")
    assert all(len(cut) >= SPLIT_FROM for cut in cuts)  # each one takes the split path
    for cut in cuts:
        with pytest.raises(DecodeError):
            parse_infer_request(cut)
    assert wire_request.DECODERS["/inference.GRPCInferenceService/ModelInfer"] is parse_infer_request


@pytest.mark.parametrize("ident", ["", "a", "ab", "abc"])  # shifts the tensor's offset in the body: every alignment
def test_large_requests_at_every_alignment_give_the_models_answer(hostd, demo_store, ident):
    x = np.random.default_rng(len(ident)).random((1100, 64), dtype=np.float32)  # 282 KB: split, under the 1 MiB limit
    req = pb.ModelInferRequest(model_name="mlp_nobatch", id=ident, raw_input_contents=[x.tobytes()])
    req.inputs.add(name="input", datatype="FP32", shape=list(x.shape))
    assert len(req.SerializeToString()) > SPLIT_FROM
    with grpc.insecure_channel(hostd.addr) as ch:
        resp = grpc_service_pb2_grpc.GRPCInferenceServiceStub(ch).ModelInfer(req, timeout=60)
    assert resp.id == ident
    np.testing.assert_allclose(out_array(resp), local_mlp(demo_store, x, "mlp_nobatch"), rtol=1e-4, atol=1e-5)


def test_a_large_request_with_a_wrong_size_is_invalid_argument(hostd):
    x = np.zeros((1100, 64), np.float32)
    req = pb.ModelInferRequest(model_name="mlp_nobatch", raw_input_contents=[x.tobytes()[:-4]])
    req.inputs.add(name="input", datatype="FP32", shape=list(x.shape))
    with grpc.insecure_channel(hostd.addr) as ch, pytest.raises(grpc.RpcError) as e:
        grpc_service_pb2_grpc.GRPCInferenceServiceStub(ch).ModelInfer(req, timeout=60)
    assert e.value.code() is grpc.StatusCode.INVALID_ARGUMENT and "needs" in e.value.details()
    body = req.SerializeToString()[:-1]  # truncated on the wire
    with grpc.insecure_channel(hostd.addr) as ch, pytest.raises(grpc.RpcError) as e:
        ch.unary_unary("/inference.GRPCInferenceService/ModelInfer")(body, timeout=60)
    assert e.value.code() is grpc.StatusCode.INVALID_ARGUMENT
