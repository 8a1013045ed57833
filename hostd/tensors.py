"""Between v2 protobuf tensors and numpy, with validation against the model's signature.

Raw inputs (`raw_input_contents`) of a large request arrive as views into its body (hostd/wire_request.py)
and become np.frombuffer views of it, with no copy; a small request's are read with one copy, the one
protobuf makes when a bytes field is read out of its message. Typed `contents` are read from
the matching repeated field. Every problem is an InvalidArgument naming the tensor and what was wrong.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ground.errors import InvalidArgument, shown
from ground.manifest import DATATYPES, ModelFormat, ModelManifest, TensorSpec
from protos import grpc_service_pb2 as pb

_NP = {k: np.dtype(v) for k, v in DATATYPES.items() if k != "BYTES"}
_V2_OF_NP = {v: k for k, v in _NP.items()}

# Which typed-contents field carries each datatype (v2 spec).
_CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


@dataclass(slots=True)
class DecodedRequest:
    inputs: dict[str, np.ndarray]
    outputs: list[str]  # requested output names, in model order when none were requested
    raw: bool  # answer with raw_output_contents
    rows: int  # batch rows (1 for models that do not batch)
    shape_key: tuple
    nbytes: int


def v2_datatype(arr: np.ndarray) -> str:
    if arr.dtype == object or arr.dtype.kind in ("S", "U"):
        return "BYTES"
    try:
        return _V2_OF_NP[arr.dtype]
    except KeyError:
        raise InvalidArgument(f"unsupported output dtype {arr.dtype}") from None


def _numel(shape, name: str, limit: int) -> int:
    n = 1
    for d in shape:
        if d < 0:
            raise InvalidArgument(f"input {shown(name)}: shape {list(shape)} has a negative dimension")
        n *= d
        if n > limit:
            raise InvalidArgument(f"input {shown(name)}: shape {list(shape)} is larger than the request size limit")
    return n


def _check_shape(spec: TensorSpec, shape: list[int], max_batch: int) -> None:
    if len(shape) != len(spec.shape):
        raise InvalidArgument(
            f"input {spec.name!r}: expected {len(spec.shape)} dimensions {spec.shape}, got shape {shape}"
        )
    for i, (want, got) in enumerate(zip(spec.shape, shape, strict=True)):
        if want != -1 and want != got:
            raise InvalidArgument(f"input {spec.name!r}: dimension {i} must be {want}, got shape {shape}")
    if max_batch > 0:
        if shape[0] < 1:
            raise InvalidArgument(f"input {spec.name!r}: batch dimension must be at least 1, got {shape[0]}")
        if shape[0] > max_batch:
            raise InvalidArgument(
                f"input {spec.name!r}: batch size {shape[0]} exceeds the model's max_batch_size {max_batch}"
            )


def _decode_bytes_raw(buf: bytes, n: int, name: str) -> np.ndarray:
    out = np.empty(n, dtype=object)
    off = 0
    for i in range(n):
        if off + 4 > len(buf):
            raise InvalidArgument(f"input {shown(name)}: raw BYTES content ends inside element {i}")
        (ln,) = struct.unpack_from("<I", buf, off)
        off += 4
        if off + ln > len(buf):
            raise InvalidArgument(f"input {shown(name)}: raw BYTES element {i} runs past the end of the content")
        out[i] = bytes(buf[off : off + ln])
        off += ln
    if off != len(buf):
        raise InvalidArgument(f"input {shown(name)}: {len(buf) - off} bytes left over after {n} BYTES elements")
    return out


def _check_utf8(arr: np.ndarray, name: str) -> None:
    """ONNX string tensors are UTF-8 text; refuse other bytes here, before they can fail a whole batch."""
    for i, v in enumerate(arr.flat):
        try:
            v.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidArgument(f"input {shown(name)}: BYTES element {i} is not valid UTF-8, which ONNX string tensors need") from None


def encode_bytes_raw(arr: np.ndarray) -> bytes:
    parts = []
    for v in arr.ravel():
        b = v if isinstance(v, bytes) else str(v).encode()
        parts.append(struct.pack("<I", len(b)))
        parts.append(b)
    return b"".join(parts)


def decode_request(req: pb.ModelInferRequest, m: ModelManifest, max_bytes: int,
                   raw: Sequence[memoryview] | None = None) -> DecodedRequest:
    """`raw`: the raw input values split out of the request's bytes (hostd/wire_request.py), if they were;
    else the request's own raw_input_contents."""
    specs = {t.name: t for t in m.inputs}
    raw_list: Sequence = raw if raw is not None else req.raw_input_contents
    use_raw = len(raw_list) > 0
    if use_raw and len(raw_list) != len(req.inputs):
        raise InvalidArgument(
            f"raw_input_contents has {len(raw_list)} entries but the request has {len(req.inputs)} inputs"
        )
    max_batch = m.max_batch_size or 0  # resolved manifests say 0 for models that do not batch
    seen: dict[str, np.ndarray] = {}
    rows = None
    total = 0
    for i, t in enumerate(req.inputs):
        spec = specs.get(t.name)
        if spec is None:
            raise InvalidArgument(f"unknown input {shown(t.name)}; the model's inputs are {sorted(specs)}")
        if t.name in seen:
            raise InvalidArgument(f"input {shown(t.name)} given more than once")
        dt = t.datatype.upper()
        if dt != spec.datatype:
            raise InvalidArgument(f"input {shown(t.name)}: expected datatype {spec.datatype}, got {t.datatype[:32] or '(empty)'}")
        shape = list(t.shape)
        _check_shape(spec, shape, max_batch)
        n = _numel(shape, t.name, max_bytes)
        if use_raw:
            if t.HasField("contents"):
                raise InvalidArgument(f"input {shown(t.name)}: give either contents or raw_input_contents, not both")
            buf = raw_list[i]
            total += len(buf)
            if total > max_bytes:
                raise InvalidArgument(f"request tensors exceed the size limit of {max_bytes} bytes")
            if dt == "BYTES":
                arr = _decode_bytes_raw(buf, n, t.name)
            else:
                want = n * _NP[dt].itemsize
                if len(buf) != want:
                    raise InvalidArgument(
                        f"input {shown(t.name)}: raw content has {len(buf)} bytes, shape {shape} of {dt} needs {want}"
                    )
                arr = np.frombuffer(buf, dtype=_NP[dt])
        else:
            if dt == "FP16":
                raise InvalidArgument(f"input {shown(t.name)}: FP16 data must be sent in raw_input_contents")
            field = getattr(t.contents, _CONTENTS_FIELD[dt])
            if len(field) != n:
                raise InvalidArgument(
                    f"input {shown(t.name)}: contents has {len(field)} elements, shape {shape} needs {n}"
                )
            if dt == "BYTES":
                arr = np.empty(n, dtype=object)
                arr[:] = list(field)
                total += sum(len(b) for b in field)
            else:
                arr = np.asarray(field, dtype=_NP[dt])
                total += arr.nbytes
            if total > max_bytes:
                raise InvalidArgument(f"request tensors exceed the size limit of {max_bytes} bytes")
        if dt == "BYTES" and m.format is ModelFormat.ONNX:
            _check_utf8(arr, t.name)
        arr = arr.reshape(shape)
        seen[t.name] = arr
        if max_batch > 0:
            if rows is None:
                rows = shape[0]
            elif shape[0] != rows:
                raise InvalidArgument(f"input {shown(t.name)}: batch size {shape[0]} differs from other inputs ({rows})")
    missing = [n for n in specs if n not in seen]
    if missing:
        raise InvalidArgument(f"missing input(s) {missing}")
    out_names = [o.name for o in m.outputs]
    requested = [o.name for o in req.outputs]
    for name in requested:
        if name not in out_names:
            raise InvalidArgument(f"unknown output {shown(name)}; the model's outputs are {out_names}")
    shape_key = tuple((n, seen[n].shape[1:] if max_batch > 0 else seen[n].shape) for n in specs)
    return DecodedRequest(
        inputs=seen,
        outputs=requested or out_names,
        raw=use_raw,
        rows=rows if rows is not None else 1,
        shape_key=shape_key,
        nbytes=total,
    )


def _set_contents(c: pb.InferTensorContents, dt: str, arr: np.ndarray) -> None:
    flat = arr.ravel()
    if dt == "BYTES":
        c.bytes_contents.extend(v if isinstance(v, bytes) else str(v).encode() for v in flat)
    else:
        getattr(c, _CONTENTS_FIELD[dt]).extend(flat.tolist())


def _raw_bytes(arr: np.ndarray, dt: str) -> bytes:
    """One output's raw content. Numeric tensors: `tobytes()` writes C order straight from the array's memory
    whatever its layout (one copy; `np.ascontiguousarray` first would add a second one for a strided array)."""
    return encode_bytes_raw(arr) if dt == "BYTES" else arr.tobytes()


def encode_response(
    req: pb.ModelInferRequest, m: ModelManifest, outputs: dict[str, np.ndarray], names: list[str], raw: bool
) -> pb.ModelInferResponse:
    """Raw outputs when the request used raw inputs. The spec wants either raw for every output or typed
    contents for every output, and FP16 has no typed field, so an FP16 output makes the whole answer raw.

    A raw response is built in one constructor call, its outputs and raw contents given as lists. What each
    numeric output's bytes still go through, and why:
      1. `ndarray.tobytes()`: the array's memory into a Python bytes object. protobuf (upb) takes bytes only,
         never a memoryview or bytearray, so there is no zero-copy way in.
      2. into the message: upb keeps every field in its own arena, so handing it bytes copies them (the same
         for `append` and the constructor; measured, bench/encode.py).
      3. serialising: gRPC calls SerializeToString on what the handler returns, outside this module.
    Removed: the `np.ascontiguousarray` copy for outputs that are not C-contiguous (~15% off a strided
    1 MiB output), and the per-output `outputs.add` / `raw_output_contents.append` calls (constructor and
    append cost the same: the copy into the arena is the cost). For a C-contiguous output, 1 and 2 are all
    there is (about two memcpys); with glibc's default thresholds each fresh 1 MiB buffer is mapped and
    page-faulted again, which costs ten times the copies (an allocator setting, see bench/encode.py).
    BYTES tensors are length-prefixed elements (encode_bytes_raw); typed `contents` answers are built as
    before.
    """
    dts = {n: v2_datatype(outputs[n]) for n in names}
    if raw or "FP16" in dts.values():
        return pb.ModelInferResponse(
            model_name=req.model_name, model_version=m.version, id=req.id,
            outputs=[pb.ModelInferResponse.InferOutputTensor(name=n, datatype=dts[n], shape=outputs[n].shape)
                     for n in names],
            raw_output_contents=[_raw_bytes(outputs[n], dts[n]) for n in names],
        )
    resp = pb.ModelInferResponse(model_name=req.model_name, model_version=m.version, id=req.id)
    for name in names:
        arr, dt = outputs[name], dts[name]
        o = resp.outputs.add(name=name, datatype=dt, shape=arr.shape)
        _set_contents(o.contents, dt, arr)
    return resp
