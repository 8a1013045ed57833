"""hostd/wire_request.py: a large ModelInfer body without raw_input_contents (typed contents) is parsed
whole, as it arrived: there are no raw values to keep out of protobuf's copy, so the rest is not joined into
a second copy of the body."""

from __future__ import annotations

from types import SimpleNamespace

from ground.wire import SERVICE
from hostd import wire_request
from hostd.wire_request import RAW_INPUTS, SPLIT_FROM, parse_infer_request
from protos import grpc_service_pb2 as pb


def _typed(n: int) -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name="mlp", id="typed")
    t = req.inputs.add(name="input", datatype="FP32", shape=[1, n])
    t.contents.fp32_contents.extend(float(i % 7) for i in range(n))
    return req


def test_a_large_body_with_typed_contents_is_parsed_whole(monkeypatch):
    req = _typed(SPLIT_FROM // 4 + 100)
    body = req.SerializeToString()
    assert len(body) >= SPLIT_FROM
    parsed_from = []

    class Recorder:
        @staticmethod
        def FromString(b):  # noqa: N802 - protobuf's name
            parsed_from.append(b)
            return pb.ModelInferRequest.FromString(b)

    monkeypatch.setattr(wire_request, "pb", SimpleNamespace(ModelInferRequest=Recorder))
    RAW_INPUTS.set([memoryview(b"stale")])
    parsed = parse_infer_request(body)
    assert parsed == req
    assert RAW_INPUTS.get() is None, "no raw values: the handler reads the request's own (empty) list"
    assert len(parsed_from) == 1 and parsed_from[0] is body, "the body as it arrived, not a joined copy"


def test_a_large_body_with_raw_values_is_still_split():
    req = pb.ModelInferRequest(model_name="mlp", raw_input_contents=[b"\x01" * (SPLIT_FROM + 10)])
    req.inputs.add(name="input", datatype="UINT8", shape=[1, SPLIT_FROM + 10])
    body = req.SerializeToString()
    parsed = parse_infer_request(body)
    raw = RAW_INPUTS.get()
    assert raw is not None and [bytes(v) for v in raw] == list(req.raw_input_contents)
    assert len(parsed.raw_input_contents) == 0 and parsed.inputs[0].name == "input"


def test_the_decoder_is_keyed_by_the_wire_contracts_service_name():
    assert wire_request.DECODERS == {f"/{SERVICE}/ModelInfer": parse_infer_request}
