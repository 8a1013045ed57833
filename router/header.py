"""The routing header of a v2 inference request or response (model, version, id, parameters: fields 1-4 of
ModelInferRequest and ModelInferResponse) read without materialising the tensors.

Parsing the whole body with InferHeader.FromString would keep every other field (inputs, outputs, raw
contents) as unknown fields: a 1 MB request gave a header of 1,000,010 bytes. Here the top-level protobuf
wire format is scanned instead: each field's tag is read, fields 5 and up are skipped by their length
without being copied, and only the records of fields 1-4 are parsed (InferHeader.FromString on their
concatenation, which is what the full parse would have kept of them). A body the protobuf parser would
refuse is refused here too, as INVALID_ARGUMENT.
"""

from __future__ import annotations

from google.protobuf.message import DecodeError

from ground.errors import InvalidArgument
from ground.protowire import Malformed, read_tag, skip_value
from protos.router_header_pb2 import InferHeader

HEADER_FIELDS = 4  # fields 1..4 are the same in ModelInferRequest and ModelInferResponse


def header_records(body: bytes) -> list[memoryview]:
    """The records (tag and value) of fields 1-4, in order, as views into `body`; every other field is
    checked to be well-formed and skipped. Raises Malformed."""
    buf = memoryview(body)
    pos, end = 0, len(buf)
    keep: list[memoryview] = []
    while pos < end:
        start = pos
        tag, pos = read_tag(buf, pos, end)
        pos = skip_value(buf, pos, end, tag >> 3, tag & 7)
        if tag >> 3 <= HEADER_FIELDS:
            keep.append(buf[start:pos])
    return keep


def read_header(body: bytes) -> InferHeader:
    """The header of a request or response body; InvalidArgument when the body is not a protobuf message."""
    try:
        records = header_records(body)
        return InferHeader.FromString(b"".join(records))
    except (Malformed, DecodeError) as e:  # DecodeError: fields 1-4 themselves (bad UTF-8, a bad map entry)
        raise InvalidArgument(f"malformed InferHeader: {e}") from None
