"""Protobuf's wire format by hand, for the places that must not build or parse a whole message: the router
reads a request's routing header without materialising its tensors (router/header.py) and writes stream
responses around bytes it never parses; hostd reads a request's raw tensors as views into the bytes that
arrived (hostd/wire_request.py) and splits ONNX weights out of a model file.

Reading checks the framing as protobuf's parser would (truncated varints and fields, invalid field numbers
and wire types, unbalanced groups) and raises Malformed; what the fields hold is left to the parser."""

from __future__ import annotations

_MAX_TAG = 0xFFFFFFFF
_MAX_GROUP_DEPTH = 100
LENGTH_DELIMITED = 2


class Malformed(ValueError):
    """The bytes are not a protobuf message."""


def encode_varint(v: int) -> bytes:
    """`v` (>= 0) as a protobuf varint: 7 bits a byte, low bits first, the high bit set on all but the last."""
    out = bytearray()
    while True:
        c = v & 0x7F
        v >>= 7
        if v:
            out.append(c | 0x80)
        else:
            out.append(c)
            return bytes(out)


def read_varint(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
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


def read_tag(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    """(tag: field number << 3 | wire type, position after it)."""
    tag, pos = read_varint(buf, pos, end)
    if tag > _MAX_TAG or tag >> 3 == 0:
        raise Malformed("invalid field number")
    return tag, pos


def skip_value(buf: memoryview, pos: int, end: int, field: int, wire_type: int, depth: int = 0) -> int:
    """The position after the value of one field whose tag ended at `pos`."""
    if wire_type == 0:
        _, pos = read_varint(buf, pos, end)
    elif wire_type == 1:
        pos += 8
    elif wire_type == 5:
        pos += 4
    elif wire_type == LENGTH_DELIMITED:
        n, pos = read_varint(buf, pos, end)
        pos += n
    elif wire_type == 3:  # a group: fields up to the matching end-group tag
        if depth >= _MAX_GROUP_DEPTH:
            raise Malformed("groups nested too deeply")
        while True:
            tag, pos = read_tag(buf, pos, end)
            if tag & 7 == 4:
                if tag >> 3 != field:
                    raise Malformed("mismatched end-group tag")
                return pos
            pos = skip_value(buf, pos, end, tag >> 3, tag & 7, depth + 1)
    else:  # 4 (an end-group tag outside its group), 6, 7
        raise Malformed(f"invalid wire type {wire_type}")
    if pos > end:
        raise Malformed("truncated field")
    return pos


def split_bytes_field(body: bytes | memoryview, field: int) -> tuple[list[memoryview], list[memoryview]]:
    """A message's top-level records split in two, as views into `body` (nothing copied): the values of
    length-delimited `field` (a repeated bytes field: each value without its tag and length), and every
    other record whole (tag and value, in order: their concatenation is the message without `field`).
    Raises Malformed."""
    buf = memoryview(body)
    pos, end = 0, len(buf)
    values: list[memoryview] = []
    rest: list[memoryview] = []
    while pos < end:
        start = pos
        tag, pos = read_tag(buf, pos, end)
        if tag == (field << 3 | LENGTH_DELIMITED):
            n, vpos = read_varint(buf, pos, end)
            pos = vpos + n
            if pos > end:
                raise Malformed("truncated field")
            values.append(buf[vpos:pos])
            continue
        pos = skip_value(buf, pos, end, tag >> 3, tag & 7)
        rest.append(buf[start:pos])
    return values, rest
