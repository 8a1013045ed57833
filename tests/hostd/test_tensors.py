"""Tensor conversion and validation, without a server."""

import numpy as np
import pytest

from ground.errors import InvalidArgument
from hostd.tensors import decode_request, encode_bytes_raw, encode_response
from ground.manifest import ModelFormat, ModelManifest, TensorSpec
from protos import grpc_service_pb2 as pb

M = ModelManifest(
    tenant="t", model="m", version="1", format=ModelFormat.ONNX, model_file="model.onnx", max_batch_size=4,
    inputs=[TensorSpec(name="x", datatype="FP32", shape=[-1, 3]), TensorSpec(name="s", datatype="BYTES", shape=[-1, 1])],
    outputs=[TensorSpec(name="y", datatype="FP32", shape=[-1, 3])],
)


def req(raw=True, x=None, s=(b"a", b"bc"), shape_x=None):
    x = np.arange(6, dtype=np.float32).reshape(2, 3) if x is None else x
    r = pb.ModelInferRequest(model_name="m")
    r.inputs.add(name="x", datatype="FP32", shape=shape_x or list(x.shape))
    r.inputs.add(name="s", datatype="BYTES", shape=[len(s), 1])
    if raw:
        r.raw_input_contents.append(x.tobytes())
        r.raw_input_contents.append(encode_bytes_raw(np.array(s, dtype=object)))
    else:
        r.inputs[0].contents.fp32_contents.extend(x.ravel().tolist())
        r.inputs[1].contents.bytes_contents.extend(s)
    return r


@pytest.mark.parametrize("raw", [True, False])
def test_decode_roundtrip(raw):
    d = decode_request(req(raw=raw), M, 1 << 20)
    assert d.raw is raw and d.rows == 2
    np.testing.assert_array_equal(d.inputs["x"], np.arange(6, dtype=np.float32).reshape(2, 3))
    assert list(d.inputs["s"].ravel()) == [b"a", b"bc"]
    assert d.outputs == ["y"]


def test_bad_inputs_name_the_tensor():
    r = req()
    r.inputs[0].datatype = "INT64"
    with pytest.raises(InvalidArgument, match="'x'.*FP32"):
        decode_request(r, M, 1 << 20)
    with pytest.raises(InvalidArgument, match="'x'.*dimension 1 must be 3"):
        decode_request(req(x=np.zeros((2, 2), np.float32)), M, 1 << 20)
    with pytest.raises(InvalidArgument, match="batch size 5 exceeds"):
        decode_request(req(x=np.zeros((5, 3), np.float32), s=[b"a"] * 5), M, 1 << 20)
    r = req()
    r.raw_input_contents[0] = r.raw_input_contents[0][:-1]
    with pytest.raises(InvalidArgument, match="raw content has 23 bytes"):
        decode_request(r, M, 1 << 20)
    r = req()
    r.raw_input_contents[1] = r.raw_input_contents[1] + b"\x01"
    with pytest.raises(InvalidArgument, match="left over"):
        decode_request(r, M, 1 << 20)
    with pytest.raises(InvalidArgument, match="size limit"):
        decode_request(req(), M, 10)
    r = req()
    r.outputs.add(name="nope")
    with pytest.raises(InvalidArgument, match="unknown output 'nope'"):
        decode_request(r, M, 1 << 20)
    with pytest.raises(InvalidArgument, match="batch size 1 differs"):
        decode_request(req(s=[b"a"]), M, 1 << 20)


def test_huge_claimed_shape_is_refused_without_allocating():
    dyn = M.model_copy(update={"inputs": [TensorSpec(name="x", datatype="FP32", shape=[-1, -1]), M.inputs[1]]})
    with pytest.raises(InvalidArgument, match="larger than the request size limit"):
        decode_request(req(shape_x=[2, 3 * 10**12]), dyn, 1 << 20)


def test_encode_raw_and_typed():
    y = np.arange(6, dtype=np.float32).reshape(2, 3)
    r = req()
    raw = encode_response(r, M, {"y": y}, ["y"], raw=True)
    assert np.frombuffer(raw.raw_output_contents[0], np.float32).tolist() == y.ravel().tolist()
    typed = encode_response(r, M, {"y": y}, ["y"], raw=False)
    assert list(typed.outputs[0].contents.fp32_contents) == y.ravel().tolist()
    assert list(typed.outputs[0].shape) == [2, 3]
    half = encode_response(r, M, {"y": y.astype(np.float16)}, ["y"], raw=False)
    assert half.outputs[0].datatype == "FP16" and len(half.raw_output_contents) == 1


def _encode_by_append(r, m, outputs, names, raw):
    """The response built field by field (the way encode_response used to): the reference for the bytes."""
    resp = pb.ModelInferResponse(model_name=r.model_name, model_version=m.version, id=r.id)
    for name in names:
        arr = outputs[name]
        dt = "BYTES" if arr.dtype == object else {np.float32: "FP32", np.float16: "FP16", np.int64: "INT64",
                                                   np.bool_: "BOOL"}[arr.dtype.type]
        resp.outputs.add(name=name, datatype=dt, shape=arr.shape)
        resp.raw_output_contents.append(encode_bytes_raw(arr) if dt == "BYTES" else np.ascontiguousarray(arr).tobytes())
    return resp


def test_raw_response_is_byte_for_byte_the_same_for_any_layout():
    r = req()
    r.id = "abc"
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    outputs = {
        "y": base[:, ::2],  # strided: not C-contiguous
        "t": base.T,  # Fortran order
        "i": np.arange(3, dtype=np.int64),
        "b": np.array([[True, False]]),
        "h": np.full((2, 2), 0.5, np.float16),
        "s": np.array([[b"a"], [b"\xc3\xa9t\xc3\xa9"]], dtype=object),
        "z": np.zeros((0, 3), np.float32),
        "c": np.float32(7.0).reshape(()),  # 0-d
    }
    names = list(outputs)
    got = encode_response(r, M, outputs, names, raw=True)
    assert got.SerializeToString() == _encode_by_append(r, M, outputs, names, True).SerializeToString()
    assert np.frombuffer(got.raw_output_contents[1], np.float32).reshape(6, 4).tolist() == base.T.tolist()
    assert [o.name for o in got.outputs] == names and got.id == "abc" and got.model_version == "1"
    assert list(got.outputs[7].shape) == [] and len(got.raw_output_contents[6]) == 0


def test_typed_response_unchanged_and_fp16_makes_it_raw():
    r = req()
    y = np.arange(6, dtype=np.float32).reshape(2, 3)
    typed = encode_response(r, M, {"y": y, "s": np.array([b"q", "w"], dtype=object)}, ["y", "s"], raw=False)
    assert not typed.raw_output_contents
    assert list(typed.outputs[1].contents.bytes_contents) == [b"q", b"w"] and typed.outputs[1].datatype == "BYTES"
    outs = {"y": y, "h": y.astype(np.float16)}
    mixed = encode_response(r, M, outs, ["y", "h"], raw=False)
    assert mixed.SerializeToString() == _encode_by_append(r, M, outs, ["y", "h"], True).SerializeToString()
