"""router/rest_codec.py, pure: every v2 datatype between JSON and the raw bytes gRPC carries, shapes, Triton's
binary tensor extension both ways (bodies built and read by tritonclient.http's own encoder and decoder), and
each kind of malformed request refused with InvalidArgument (HTTP 400) and a message that names the fault."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.http._utils import _get_inference_request
from tritonclient.utils import serialize_byte_tensor

from ground.errors import InvalidArgument
from protos import grpc_service_pb2 as pb
from router import rest_codec as codec

NUMERIC = {"BOOL": [True, False, True], "UINT8": [0, 7, 255], "UINT16": [0, 65535, 3], "UINT32": [0, 2**32 - 1, 9],
           "UINT64": [0, 2**64 - 1, 5], "INT8": [-128, 0, 127], "INT16": [-32768, 1, 32767],
           "INT32": [-(2**31), 0, 2**31 - 1], "INT64": [-(2**63), 0, 2**63 - 1], "FP16": [0.5, -1.25, 65504.0],
           "FP32": [0.1, -2.5, 3.0e38], "FP64": [1e-300, -2.5, 1e300], "BF16": [1.0, -2.5, 3.140625]}


def body_of(inputs, outputs=None, **kw) -> tuple[dict, bytes]:
    """What tritonclient.http sends for `inputs` and `outputs`, split as the router splits it."""
    raw, header_length = _get_inference_request(inputs, kw.get("request_id", ""), outputs, 0, False, False, 0,
                                                kw.get("timeout"), kw.get("parameters"))
    return codec.split_body(raw, None if header_length is None else str(header_length))


def refused(fn, *args, match: str) -> None:
    with pytest.raises(InvalidArgument, match=match):
        fn(*args)


# -- datatypes ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("datatype", sorted(NUMERIC))
def test_every_numeric_datatype_goes_from_json_to_raw_bytes_and_back(datatype):
    values = NUMERIC[datatype]
    raw = codec.json_to_raw(datatype, [3], values, "x")
    if datatype == "BF16":
        assert raw == (np.asarray(values, np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()
    else:
        assert raw == np.array(values, dtype=codec.NUMPY[datatype]).tobytes()
    back = codec.raw_to_json(datatype, raw, "x")
    if datatype == "FP32":
        assert back == pytest.approx(values, rel=1e-6)
    else:
        assert back == values  # FP16 and BF16 values here are exact in 16 bits


def test_fp16_in_json_is_numbers_packed_as_half_floats():
    raw = codec.json_to_raw("FP16", [2, 2], [[1, 0.5], [-2, 1e6]], "x")  # ints are numbers too; 1e6 is past FP16
    assert np.frombuffer(raw, np.float16).tolist() == [1.0, 0.5, -2.0, float("inf")]


def test_bf16_rounds_to_nearest_even():
    raw = codec.json_to_raw("BF16", [3], [1.00390625, 1.01171875, float("nan")], "x")
    back = codec.raw_to_json("BF16", raw, "x")
    assert back[:2] == [1.0, 1.015625] and np.isnan(back[2])


def test_bytes_are_utf8_strings_in_json_and_length_prefixed_in_raw():
    raw = codec.json_to_raw("BYTES", [1, 3], [["a", "héllo", ""]], "x")
    assert raw == serialize_byte_tensor(np.array([b"a", "héllo".encode(), b""], dtype=object)).item()
    assert codec.raw_to_json("BYTES", raw, "x") == ["a", "héllo", ""]
    refused(codec.json_to_raw, "BYTES", [1], [3], "x", match="BYTES elements in JSON must be strings")
    refused(codec.raw_to_json, "BYTES", codec.pack_bytes([b"\xff\xfe"]), "output 'y'", match="not UTF-8.*binary_data")


def test_nested_or_flat_data_must_hold_exactly_the_shapes_elements():
    flat = codec.json_to_raw("INT32", [2, 3], [1, 2, 3, 4, 5, 6], "x")
    assert codec.json_to_raw("INT32", [2, 3], [[1, 2, 3], [4, 5, 6]], "x") == flat
    assert codec.json_to_raw("FP32", [0, 4], [], "x") == b""
    refused(codec.json_to_raw, "INT32", [2, 3], [1, 2, 3], "input 'x'", match=r"input 'x': 3 elements .* \[2, 3\]")
    refused(codec.json_to_raw, "INT32", [2, 2], [[1, 2], [3]], "x", match="ragged|elements")
    refused(codec.json_to_raw, "BYTES", [2], ["a"], "x", match="1 elements")


@pytest.mark.parametrize("datatype, data, match", [
    ("FP32", ["1.0"], "must be numbers"), ("FP32", [None], "must be numbers"), ("INT32", [True], "must be integers"),
    ("INT32", [1.5], "must be integers"), ("UINT8", [256], r"out of the UINT8 range"), ("UINT8", [-1], "range"),
    ("INT64", [2**63], "out of the INT64 range"), ("UINT64", [-1, 2**64 - 1], "range"),
    ("INT8", [1, "a"], "integers"), ("BOOL", [1], "true/false"),
])
def test_json_values_of_the_wrong_kind_are_refused(datatype, data, match):
    refused(codec.json_to_raw, datatype, [len(data)], data, "x", match=match)


# -- requests ---------------------------------------------------------------------------------------------


def test_json_and_binary_inputs_become_raw_contents_in_input_order():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.array([[b"x", b"yz"]], dtype=object)
    c = np.array([1, -2], dtype=np.int64)
    ins = [httpclient.InferInput("a", [2, 3], "FP32").set_data_from_numpy(a, binary_data=True),
           httpclient.InferInput("b", [1, 2], "BYTES").set_data_from_numpy(b, binary_data=False),
           httpclient.InferInput("c", [2], "INT64").set_data_from_numpy(c, binary_data=True)]
    outs = [httpclient.InferRequestedOutput("y", binary_data=True), httpclient.InferRequestedOutput("z", binary_data=False)]
    obj, tail = body_of(ins, outs, request_id="r1", timeout=2500, parameters={"tag": "t", "w": 0.5, "on": True})
    req, fmt = codec.infer_request("m", "2", obj, tail)
    assert (req.model_name, req.model_version, req.id) == ("m", "2", "r1")
    assert [(t.name, t.datatype, list(t.shape)) for t in req.inputs] == [
        ("a", "FP32", [2, 3]), ("b", "BYTES", [1, 2]), ("c", "INT64", [2])]
    assert list(req.raw_input_contents) == [a.tobytes(), codec.pack_bytes([b"x", b"yz"]), c.tobytes()]
    assert all(not t.parameters for t in req.inputs)  # binary_data_size is the extension's, not the model's
    assert codec.get_params(req.parameters) == {"timeout": 2500, "tag": "t", "w": 0.5, "on": True}
    assert [o.name for o in req.outputs] == ["y", "z"] and all(not o.parameters for o in req.outputs)
    assert (fmt.wants_binary("y"), fmt.wants_binary("z"), fmt.wants_binary("other")) == (True, False, False)


def test_no_outputs_named_means_all_in_binary_as_tritonclient_asks():
    x = np.ones((1, 2), np.float32)
    obj, tail = body_of([httpclient.InferInput("x", [1, 2], "FP32").set_data_from_numpy(x, binary_data=False)])
    req, fmt = codec.infer_request("m", "", obj, tail)
    assert fmt.binary_default and fmt.wants_binary("anything") and not req.parameters  # binary_data_output stays here


def test_big_unsigned_parameters_and_odd_ones():
    req = pb.ModelInferRequest()
    codec.set_params(req.parameters, {"seq": 2**64 - 1, "neg": -5}, "request")
    assert req.parameters["seq"].uint64_param == 2**64 - 1 and req.parameters["neg"].int64_param == -5
    refused(codec.set_params, req.parameters, {"l": [1]}, "request", match="parameter 'l' must be")
    refused(codec.set_params, req.parameters, {"h": 2**65}, "request", match="64-bit")


def test_responses_in_json_and_binary_read_back_by_tritonclient():
    y = np.arange(8, dtype=np.float16).reshape(2, 4)
    z = np.array([b"ok", b"\xff"], dtype=object)
    w = np.array([[1, 2]], dtype=np.uint8)
    resp = pb.ModelInferResponse(model_name="m", model_version="3", id="r9")
    resp.parameters["took"].int64_param = 7
    resp.outputs.add(name="y", datatype="FP16", shape=[2, 4])
    resp.outputs.add(name="z", datatype="BYTES", shape=[2])
    resp.outputs.add(name="w", datatype="UINT8", shape=[1, 2])
    resp.raw_output_contents.extend([y.tobytes(), serialize_byte_tensor(z).item(), w.tobytes()])
    body, header_length = codec.infer_response(resp, codec.OutputFormat(binary={"y": False, "z": True, "w": True}))
    assert header_length is not None
    head = json.loads(body[:header_length])
    assert (head["model_name"], head["model_version"], head["id"], head["parameters"]) == ("m", "3", "r9", {"took": 7})
    assert head["outputs"][0]["data"] == y.flatten().tolist()  # FP16 in JSON: numbers
    result = httpclient.InferResult.from_response_body(body, header_length=header_length)
    np.testing.assert_array_equal(result.as_numpy("y"), y)
    assert result.as_numpy("z").tolist() == [b"ok", b"\xff"]
    np.testing.assert_array_equal(result.as_numpy("w"), w)
    body, header_length = codec.infer_response(resp, codec.OutputFormat(binary={"z": True}))
    assert json.loads(body[:header_length])["outputs"][2]["data"] == [1, 2]


def test_typed_contents_in_an_answer_are_read_as_raw_ones():
    resp = pb.ModelInferResponse(model_name="m")
    out = resp.outputs.add(name="p", datatype="FP32", shape=[3])
    out.contents.fp32_contents.extend([0.5, 1.5, -1.0])
    body, header_length = codec.infer_response(resp, codec.OutputFormat())
    assert header_length is None and json.loads(body)["outputs"][0]["data"] == [0.5, 1.5, -1.0]
    body, header_length = codec.infer_response(resp, codec.OutputFormat(binary_default=True))
    assert body[header_length:] == np.array([0.5, 1.5, -1.0], np.float32).tobytes()


# -- malformed requests ---------------------------------------------------------------------------------------


def one_input(**fields) -> dict:
    return {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], **fields}]}


@pytest.mark.parametrize("obj, tail, match", [
    ({}, b"", "'inputs' must be a non-empty list"),
    (one_input(datatype="FP8", data=[1, 2]), b"", r"unknown datatype 'FP8'; one of BF16, BOOL, BYTES"),
    (one_input(shape=[1, -2], data=[1, 2]), b"", "shape must be a list of non-negative integers"),
    (one_input(), b"", "no 'data' and no binary_data_size"),
    (one_input(data=[1, 2], parameters={"binary_data_size": 8}), b"\0" * 8, "both 'data' and binary_data_size"),
    (one_input(parameters={"binary_data_size": 4}), b"\0" * 4, "4 bytes of binary data, but FP32 \\[1, 2\\] takes 8"),
    (one_input(parameters={"binary_data_size": 8}), b"\0" * 4, "runs past the binary data"),
    (one_input(parameters={"binary_data_size": 8}), b"\0" * 12, "4 bytes of binary data after the last binary input"),
    (one_input(parameters={"binary_data_size": "8"}), b"\0" * 8, "binary_data_size must be a non-negative integer"),
    (one_input(parameters={"shared_memory_region": "r"}), b"", "shared memory is not served"),
    ({"inputs": [{"name": "s", "datatype": "BYTES", "shape": [2], "parameters": {"binary_data_size": 6}}]},
     b"\x05\0\0\0ab", "runs past the end"),
    ({"inputs": [{"name": "s", "datatype": "BYTES", "shape": [2], "parameters": {"binary_data_size": 5}}]},
     b"\x01\0\0\0a", r"1 BYTES elements .* \[2\]"),
    ({**one_input(data=[1, 2]), "outputs": {"y": 1}}, b"", "'outputs' must be a list"),
    ({**one_input(data=[1, 2]), "id": 5}, b"", "'id' must be a string"),
])
def test_malformed_inference_requests_say_what_is_wrong(obj, tail, match):
    refused(codec.infer_request, "m", "", obj, tail, match=match)


def test_malformed_bodies_and_header_lengths():
    refused(codec.split_body, b'{"inputs": [', None, match="malformed JSON")
    refused(codec.split_body, b"\xff\xfe", None, match="malformed JSON")
    refused(codec.split_body, b"[1, 2]", None, match="must be a JSON object, not list")
    refused(codec.split_body, b"{}", "20", match="is 20 but the body has 2 bytes")
    refused(codec.split_body, b"{}", "two", match="must be a byte count")
    assert codec.split_body(b'{"a":1}xyz', "7") == ({"a": 1}, b"xyz")
    assert codec.parse_object(b"", empty_ok=True) == {}


# -- the other calls ---------------------------------------------------------------------------------------


def test_messages_are_json_with_proto_names_and_64_bit_numbers():
    md = pb.ModelMetadataResponse(name="m", versions=["1"], platform="onnxruntime_onnx")
    md.inputs.add(name="input", datatype="FP32", shape=[-1, 8])
    assert codec.message_json(md) == {"name": "m", "versions": ["1"], "platform": "onnxruntime_onnx",
                                      "inputs": [{"name": "input", "datatype": "FP32", "shape": [-1, 8]}],
                                      "outputs": []}
    st = pb.ModelStatisticsResponse()
    s = st.model_stats.add(name="m", version="1", inference_count=3, execution_count=2, last_inference=1700000000000)
    s.inference_stats.success.count, s.inference_stats.success.ns = 3, 12_000_000_000
    j = codec.stats_json(st)["model_stats"][0]
    assert (j["inference_count"], j["last_inference"], j["inference_stats"]["success"]) == (
        3, 1700000000000, {"count": 3, "ns": 12_000_000_000})
    assert j["inference_stats"]["fail"] == {"count": 0, "ns": 0}  # every field, as Triton answers
    idx = pb.RepositoryIndexResponse(models=[pb.RepositoryIndexResponse.ModelIndex(name="m", version="1", state="READY")])
    assert codec.index_json(idx) == [{"name": "m", "version": "1", "state": "READY", "reason": ""}]
    refused(codec.index_request, {"ready": "yes"}, match="'ready' must be true or false")


def test_repository_parameters_as_tritonclient_sends_them():
    req = codec.load_request("m", {"parameters": {"config": "{}", "file:1/model.onnx": base64.b64encode(b"\0\1").decode(),
                                                  "version": "2"}})
    assert req.model_name == "m" and req.parameters["file:1/model.onnx"].bytes_param == b"\0\1"
    assert req.parameters["version"].string_param == "2" and req.parameters["config"].string_param == "{}"
    assert codec.unload_request("m", {"parameters": {"unload_dependents": False}}).parameters[
        "unload_dependents"].WhichOneof("parameter_choice") == "bool_param"
    refused(codec.load_request, "m", {"parameters": {"file:x": "@@"}}, match="not valid base64")
    refused(codec.load_request, "m", {"parameters": {"pin": 1.5}}, match="parameter 'pin' must be")
