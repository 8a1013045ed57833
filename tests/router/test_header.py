"""router/header.py: the routing header (model, version, id, parameters) of a request or response, read
without copying the tensors; malformed bodies are INVALID_ARGUMENT, exactly where protobuf refuses them."""

from __future__ import annotations

import pytest
from google.protobuf.message import DecodeError

from ground.errors import InvalidArgument
from protos import grpc_service_pb2 as pb
from tests.mutations import mutated
from protos.router_header_pb2 import InferHeader
from router.header import read_header

MB = 1_000_000


def _request(payload: int = 50) -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(
        model_name="mlp", model_version="2", id="req-7",
        inputs=[pb.ModelInferRequest.InferInputTensor(name="input", datatype="UINT8", shape=[1, payload])],
        outputs=[pb.ModelInferRequest.InferRequestedOutputTensor(name="out")],
        raw_input_contents=[b"x" * payload])
    req.parameters["priority"].int64_param = 1
    req.parameters["timeout"].string_param = "200000"
    return req


def _fields(h) -> tuple:
    return h.model_name, h.model_version, h.id, {k: v for k, v in h.parameters.items()}


def test_a_1mb_request_gives_a_header_under_1kb_with_the_same_fields():
    req = _request(MB)
    body = req.SerializeToString()
    full = InferHeader.FromString(body)
    assert full.ByteSize() > MB  # what parsing the whole body keeps: the tensors, as unknown fields
    h = read_header(body)
    assert h.ByteSize() < 1000 and len(h.SerializeToString()) < 1000
    assert _fields(h) == _fields(req)


def test_the_served_version_is_read_from_a_1mb_response():
    resp = pb.ModelInferResponse(model_name="mlp", model_version="3", id="req-7",
                                 outputs=[pb.ModelInferResponse.InferOutputTensor(name="out", datatype="UINT8",
                                                                                  shape=[MB])],
                                 raw_output_contents=[b"y" * MB])
    h = read_header(resp.SerializeToString())
    assert (h.model_name, h.model_version, h.id) == ("mlp", "3", "req-7") and h.ByteSize() < 1000


def test_fields_in_any_order_and_repeated_keep_protobufs_meaning():
    a = pb.ModelInferRequest(model_name="first", raw_input_contents=[b"z" * 100])
    b = pb.ModelInferRequest(model_name="last", id="i")
    b.parameters["k"].bool_param = True
    body = a.SerializeToString() + b.SerializeToString()  # concatenation merges: the last scalar wins
    assert _fields(read_header(body)) == _fields(InferHeader.FromString(body)) == ("last", "", "i", dict(b.parameters))
    assert _fields(read_header(b"")) == ("", "", "", {})


@pytest.mark.parametrize("body", [
    b"\x0a\x05ab",  # model_name says 5 bytes, 2 follow
    b"\x3a\xff\xff\xff\x0f",  # raw_input_contents of ~4 GB, nothing follows
    b"\x3a\x80",  # truncated length varint
    b"\x00\x01",  # field number 0
    b"\x0f\x01",  # wire type 7
    b"\x2c",  # an end-group tag with no group
    b"\x2b\x08\x01",  # a group never closed
    b"\x0a\x02\xff\xfe",  # model_name that is not UTF-8
    b"\xff" * 11,  # a varint longer than 10 bytes
])
def test_malformed_bodies_are_invalid_argument(body):
    with pytest.raises(DecodeError):
        InferHeader.FromString(body)  # the full parse refuses these too
    with pytest.raises(InvalidArgument):
        read_header(body)


def test_a_truncated_1mb_request_is_invalid_argument():
    body = _request(MB).SerializeToString()
    with pytest.raises(InvalidArgument):
        read_header(body[:-1])
    with pytest.raises(InvalidArgument):
        read_header(body[: MB // 2])


def test_agrees_with_protobuf_on_mutated_bodies():
    """Random corruptions of a real request: the scanner accepts exactly what protobuf accepts, with the same
    fields (200,000 mutations agreed when this was written; a few thousand run here)."""
    base = _request().SerializeToString()
    for body in mutated(base, 3000, 7):
        try:
            full = InferHeader.FromString(body)
        except DecodeError:
            with pytest.raises(InvalidArgument):
                read_header(body)
            continue
        assert _fields(read_header(body)) == _fields(full), body.hex()
