"""An ONNX file's weights left where they lie: the graph re-written with every large top-level initializer
pointing, as external data, at its own bytes inside the buffer the file came in.

ONNX Runtime built from the file's bytes copies them twice (Python bytes into a std::string, then the
protobuf parse copies every initializer's raw_data) before prepacking. Given the graph alone (a few KB) and
the original buffer as an in-memory external data "file", it reads each initializer in place: the whole
model is never copied. Only the protobuf wire format is walked (tags and lengths, never the payloads), so
this costs well under a millisecond for a 50 MB model.

ONNX Runtime reads a weight in place only where it lies aligned to its element size; protobuf puts payloads
at any offset, and a misaligned one is copied. So `split_in_place` also moves each large payload back by the
few bytes that align it, over its own (no longer needed) protobuf header, saving the bytes it overwrites:
the original file can still be written out exactly (`Split.original`), e.g. to the disk tier.

Anything unexpected (another field layout, initializers already external, a malformed file) returns None and
the caller loads the original bytes, where ONNX Runtime gives its own verdict.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from dataclasses import dataclass, field

from ground.protowire import LENGTH_DELIMITED, Malformed, encode_varint, read_tag, read_varint, skip_value

# Field numbers from onnx.proto3
_MODEL_GRAPH = 7
_GRAPH_INITIALIZER = 5
_TENSOR_DATA_TYPE = 2
_TENSOR_RAW_DATA = 9
_TENSOR_EXTERNAL_DATA = 13
_TENSOR_DATA_LOCATION = 14
MIN_EXTERNAL_BYTES = 1024  # smaller initializers stay inline (shapes, scalars: nothing to gain)
# bytes per element by TensorProto.DataType (FLOAT, UINT8, INT8, UINT16, INT16, INT32, INT64, BOOL, FLOAT16,
# DOUBLE, UINT32, UINT64, COMPLEX64, COMPLEX128, BFLOAT16); others (4-bit, 8-bit floats) need 1
_ELEMENT = {1: 4, 2: 1, 3: 1, 4: 2, 5: 2, 6: 4, 7: 8, 9: 1, 10: 2, 11: 8, 12: 4, 13: 8, 14: 8, 15: 16, 16: 2}


@dataclass(frozen=True)
class _Move:
    orig: int  # where the payload starts in the file
    new: int  # where it starts in the buffer now (orig - shift)
    length: int
    saved: bytes  # the header bytes the move overwrote: buffer[new:orig] before the move


@dataclass
class Split:
    """The graph (initializers external at `location`, offsets into the buffer) and how the buffer was
    rearranged from the file."""

    graph: bytes
    moves: list[_Move] = field(default_factory=list)

    def original(self, buf: bytes | bytearray | memoryview) -> Iterator[memoryview]:
        """The original file's bytes from the rearranged buffer, in pieces (no copy of the payloads)."""
        view = memoryview(buf).cast("B")
        pos = 0
        for mv in self.moves:
            yield view[pos : mv.new]
            yield memoryview(mv.saved)
            yield view[mv.new : mv.new + mv.length]
            pos = mv.orig + mv.length
        yield view[pos:]


def _fields(b: memoryview, start: int, end: int) -> Iterator[tuple[int, int, int, int, int]]:
    """(field number, wire type, field start, payload start, field end) for each field in b[start:end].
    Raises Malformed (ground/protowire.py), also for groups, which onnx.proto does not have."""
    i = start
    while i < end:
        tag, j = read_tag(b, i, end)
        num, wire = tag >> 3, tag & 7
        if wire == LENGTH_DELIMITED:
            n, ps = read_varint(b, j, end)
            k = ps + n
            if k > end:
                raise Malformed("truncated field")
        elif wire in (3, 4):
            raise Malformed("a group")
        else:
            ps, k = j, skip_value(b, j, end, num, wire)
        yield num, wire, i, ps, k
        i = k


def _len_field(field: int, payload: bytes) -> bytes:
    return encode_varint(field << 3 | LENGTH_DELIMITED) + encode_varint(len(payload)) + payload


def _external_tensor(b: memoryview, header: int, start: int, end: int, location: bytes,
                     align_base: int | None, moves: list[_Move]) -> bytes | None:
    """The TensorProto in b[start:end] (its field in the graph starts at `header`) with its raw_data
    replaced by a reference into the buffer; None when it has no raw_data worth moving. With `align_base`
    (the buffer's address), a misaligned payload is planned to move back over its header."""
    kept = bytearray()
    raw: tuple[int, int] | None = None
    elem = 1
    for num, wire, fs, ps, fe in _fields(b, start, end):
        if num in (_TENSOR_EXTERNAL_DATA, _TENSOR_DATA_LOCATION):
            raise Malformed("already external data: not a self-contained file")
        if num == _TENSOR_RAW_DATA and wire == LENGTH_DELIMITED:
            if raw is not None:
                raise Malformed("raw_data twice")
            raw = (ps, fe - ps)
        else:
            if num == _TENSOR_DATA_TYPE and wire == 0:
                elem = _ELEMENT.get(read_varint(b, ps, fe)[0], 1)
            kept += b[fs:fe]
    if raw is None or raw[1] < MIN_EXTERNAL_BYTES:
        return None
    offset = raw[0]
    if align_base is not None:
        shift = (align_base + offset) % elem
        if shift and offset - shift >= header:  # room in its own header (always, for real headers)
            moves.append(_Move(offset, offset - shift, raw[1], bytes(b[offset - shift : offset])))
            offset -= shift
    for k, v in ((b"location", location), (b"offset", str(offset).encode()), (b"length", str(raw[1]).encode())):
        kept += _len_field(_TENSOR_EXTERNAL_DATA, _len_field(1, k) + _len_field(2, v))
    kept += encode_varint(_TENSOR_DATA_LOCATION << 3) + encode_varint(1)  # DataLocation.EXTERNAL
    return bytes(kept)


def split_initializers(data: bytes | bytearray | memoryview, location: str) -> bytes | None:
    """The model's ModelProto with its large top-level initializers made external data at `location`,
    offsets into `data` itself (left as it is); None when the file is not one this can rewrite."""
    split = _split(data, location, None)
    return split.graph if split is not None else None


def split_in_place(data: bytearray | memoryview, location: str) -> Split | None:
    """Like split_initializers, but each misaligned payload is first moved back to its element alignment
    inside `data` (writable; it then no longer holds the file as it was: see Split.original)."""
    if len(data) == 0:
        return None
    anchor = ctypes.c_char.from_buffer(data)
    base = ctypes.addressof(anchor)
    split = _split(data, location, base)
    if split is not None:
        for mv in split.moves:  # ascending offsets; each lands in its own header, before its old place
            ctypes.memmove(base + mv.new, base + mv.orig, mv.length)
    del anchor
    return split


def _split(data: bytes | bytearray | memoryview, location: str, align_base: int | None) -> Split | None:
    b = memoryview(data).cast("B")
    loc = location.encode()
    out = bytearray()
    moves: list[_Move] = []
    graphs = moved = 0
    try:
        for num, wire, fs, ps, fe in _fields(b, 0, len(b)):
            if num != _MODEL_GRAPH or wire != LENGTH_DELIMITED:
                out += b[fs:fe]
                continue
            graphs += 1
            g = bytearray()
            for gfield, gwire, gfs, gps, gfe in _fields(b, ps, fe):
                tensor = (_external_tensor(b, gfs, gps, gfe, loc, align_base, moves)
                          if gfield == _GRAPH_INITIALIZER and gwire == LENGTH_DELIMITED else None)
                if tensor is None:
                    g += b[gfs:gfe]
                else:
                    g += _len_field(_GRAPH_INITIALIZER, tensor)
                    moved += 1
            out += _len_field(_MODEL_GRAPH, bytes(g))
    except Malformed:
        return None
    if graphs != 1 or not moved:
        return None
    return Split(bytes(out), moves)
