"""Protobuf's base-128 varint, for the places that write wire-format bytes by hand instead of building a
message (the router's stream responses around bytes it never parses; hostd's ONNX weight split)."""

from __future__ import annotations


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
