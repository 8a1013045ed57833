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
from protos.router_header_pb2 import InferHeader

HEADER_FIELDS = 4  # fields 1..4 are the same in ModelInferRequest and ModelInferResponse
_MAX_TAG = 0xFFFFFFFF
_MAX_GROUP_DEPTH = 100


class Malformed(ValueError):
    """The bytes are not a protobuf message."""


def _varint(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    """(value, position after it)."""
    value = shift = 0
    while True:
        if pos >= end:
            raise Malformed("truncated varint")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7
        if shift >= 70:
            raise Malformed("varint longer than 10 bytes")


def _skip(buf: memoryview, pos: int, end: int, field: int, wire_type: int, depth: int = 0) -> int:
    """The position after the value of one field whose tag ended at `pos`."""
    if wire_type == 0:
        _, pos = _varint(buf, pos, end)
    elif wire_type == 1:
        pos += 8
    elif wire_type == 5:
        pos += 4
    elif wire_type == 2:
        n, pos = _varint(buf, pos, end)
        pos += n
    elif wire_type == 3:  # a group: fields up to the matching end-group tag
        if depth >= _MAX_GROUP_DEPTH:
            raise Malformed("groups nested too deeply")
        while True:
            tag, pos = _tag(buf, pos, end)
            if tag & 7 == 4:
                if tag >> 3 != field:
                    raise Malformed("mismatched end-group tag")
                return pos
            pos = _skip(buf, pos, end, tag >> 3, tag & 7, depth + 1)
    else:  # 4 (an end-group tag outside its group), 6, 7
        raise Malformed(f"invalid wire type {wire_type}")
    if pos > end:
        raise Malformed("truncated field")
    return pos


def _tag(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    tag, pos = _varint(buf, pos, end)
    if tag > _MAX_TAG or tag >> 3 == 0:
        raise Malformed("invalid field number")
    return tag, pos


def header_records(body: bytes) -> list[memoryview]:
    """The records (tag and value) of fields 1-4, in order, as views into `body`; every other field is
    checked to be well-formed and skipped. Raises Malformed."""
    buf = memoryview(body)
    pos, end = 0, len(buf)
    keep: list[memoryview] = []
    while pos < end:
        start = pos
        tag, pos = _tag(buf, pos, end)
        pos = _skip(buf, pos, end, tag >> 3, tag & 7)
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
