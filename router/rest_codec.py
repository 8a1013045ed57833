"""KServe v2 REST (HTTP/JSON) <-> the v2 protobuf messages, with Triton's binary tensor extension. Pure: no
I/O, no clock; router/rest.py feeds it bodies and hands what it returns to the same servicer methods gRPC
calls. Everything a caller can get wrong raises InvalidArgument (HTTP 400) with a message that names it.

Inference requests (https://kserve.github.io/website/latest/modelserving/data_plane/v2_protocol/ and Triton's
binary_data extension):
- the body is a JSON object, or, with an `Inference-Header-Content-Length: N` header, N bytes of JSON followed
  by the binary tensors in input order; an input with parameter `binary_data_size` takes that many bytes of
  the tail, one with `data` carries its elements in JSON (flat or nested, row-major);
- every input becomes `raw_input_contents` (the v2 gRPC protocol forbids mixing typed contents and raw ones in
  one request, and the hostd reads raw bytes anyway), so JSON numbers are packed here, FP16 and BF16 included;
  BYTES elements are UTF-8 strings in JSON and 4-byte little-endian length-prefixed in binary, as on gRPC;
- outputs come back in JSON unless the request asked for binary: per output (`parameters.binary_data`) or for
  all outputs it does not list (`parameters.binary_data_output`). Binary outputs carry `binary_data_size` and
  follow the JSON; the response then has `Inference-Header-Content-Length`.
The extension's own parameters (binary_data, binary_data_size, binary_data_output) stay here; shared memory
parameters are refused (a router shares no memory with its callers); every other parameter is passed on typed
(bool, int64, uint64 past int64, double, string)."""

from __future__ import annotations

import base64
import binascii
import json
import math
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from google.protobuf import json_format
from google.protobuf.message import Message

from ground.errors import InvalidArgument, shown
from protos import grpc_service_pb2 as pb

HEADER_LENGTH = "Inference-Header-Content-Length"
BINARY_SIZE, BINARY_OUT, BINARY = "binary_data_size", "binary_data_output", "binary_data"

# v2 datatype -> numpy dtype (little-endian, as the wire carries them); BF16 is kept as its 16 raw bits.
NUMPY: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_), "UINT8": np.dtype("<u1"), "UINT16": np.dtype("<u2"), "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"), "INT8": np.dtype("<i1"), "INT16": np.dtype("<i2"), "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"), "FP16": np.dtype("<f2"), "FP32": np.dtype("<f4"), "FP64": np.dtype("<f8"),
    "BF16": np.dtype("<u2"),
}
DATATYPES = frozenset(NUMPY) | {"BYTES"}
# Typed contents of InferTensorContents, for a hostd answer that uses them instead of raw bytes.
_CONTENTS = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
             "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents",
             "UINT32": "uint_contents", "UINT64": "uint64_contents", "FP32": "fp32_contents",
             "FP64": "fp64_contents", "BYTES": "bytes_contents"}
_INT64_MAX, _UINT64_MAX = (1 << 63) - 1, (1 << 64) - 1
_NO_SHM = ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset")


# -- bodies -----------------------------------------------------------------------------------------------


def split_body(body: bytes | bytearray, header_length: str | None) -> tuple[dict[str, Any], memoryview]:
    """(the JSON object, the binary tail: a view, not a copy) of a request body."""
    n = len(body)
    if header_length is not None:
        try:
            n = int(header_length)
        except ValueError:
            raise InvalidArgument(f"{HEADER_LENGTH} must be a byte count, not {shown(header_length)}") from None
        if not 0 <= n <= len(body):
            raise InvalidArgument(f"{HEADER_LENGTH} is {n} but the body has {len(body)} bytes")
    view = memoryview(body)
    return parse_object(bytes(view[:n])), view[n:]


def parse_object(raw: bytes, *, empty_ok: bool = False) -> dict[str, Any]:
    if empty_ok and not raw.strip():
        return {}
    try:
        obj = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise InvalidArgument(f"malformed JSON in the request body: {e}") from None
    if not isinstance(obj, dict):
        raise InvalidArgument(f"the request body must be a JSON object, not {type(obj).__name__}")
    return obj


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


# -- parameters -------------------------------------------------------------------------------------------


def _params_obj(obj: dict[str, Any], where: str) -> dict[str, Any]:
    p = obj.get("parameters", {})
    if p is None:
        return {}
    if not isinstance(p, dict):
        raise InvalidArgument(f"{where} parameters must be a JSON object")
    return p


def set_params(target, params: dict[str, Any], where: str, skip: tuple[str, ...] = ()) -> None:
    """JSON parameters into a map<string, InferParameter>."""
    for k, v in params.items():
        if k in skip:
            continue
        p = target[k]
        if isinstance(v, bool):
            p.bool_param = v
        elif isinstance(v, int):
            if -_INT64_MAX - 1 <= v <= _INT64_MAX:
                p.int64_param = v
            elif 0 <= v <= _UINT64_MAX:
                p.uint64_param = v
            else:
                raise InvalidArgument(f"{where} parameter {shown(k)} is out of the 64-bit range")
        elif isinstance(v, float):
            p.double_param = v
        elif isinstance(v, str):
            p.string_param = v
        else:
            raise InvalidArgument(f"{where} parameter {shown(k)} must be a boolean, number or string")


def get_params(params) -> dict[str, Any]:
    """A map<string, InferParameter> (or ModelRepositoryParameter) as JSON values."""
    out: dict[str, Any] = {}
    for k, p in params.items():
        which = p.WhichOneof("parameter_choice")
        if which is not None:
            v = getattr(p, which)
            out[k] = v.decode("utf-8", "replace") if isinstance(v, bytes) else v
    return out


# -- inference requests -----------------------------------------------------------------------------------


@dataclass
class OutputFormat:
    """Which outputs the caller wants in binary: those it named with binary_data true, and, when
    binary_data_output is true, every other output (unnamed, or named without binary_data)."""

    binary_default: bool = False
    binary: dict[str, bool] = field(default_factory=dict)

    def wants_binary(self, name: str) -> bool:
        return self.binary.get(name, self.binary_default)


def _elements(shape: list[int]) -> int:
    return math.prod(shape)


def _shape(t: dict[str, Any], name: str) -> list[int]:
    shape = t.get("shape")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                              for d in shape):
        raise InvalidArgument(f"input {name}: shape must be a list of non-negative integers")
    return shape


def _str(obj: dict[str, Any], key: str, where: str, default: str | None = None) -> str:
    v = obj.get(key, default)
    if not isinstance(v, str):
        raise InvalidArgument(f"{where}: {key!r} must be a string")
    return v


def pack_bytes(items: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(b)) + b for b in items)


def unpack_bytes(raw: bytes, where: str) -> list[bytes]:
    out, i = [], 0
    while i < len(raw):
        if i + 4 > len(raw):
            raise InvalidArgument(f"{where}: BYTES data ends inside an element's 4-byte length")
        (n,) = struct.unpack_from("<I", raw, i)
        if i + 4 + n > len(raw):
            raise InvalidArgument(f"{where}: BYTES element of {n} bytes runs past the end of the data")
        out.append(raw[i + 4:i + 4 + n])
        i += 4 + n
    return out


def _flat(data: Any) -> list[Any]:
    out: list[Any] = []
    stack = [data]
    while stack:  # depth-first, left to right
        d = stack.pop()
        if isinstance(d, list):
            stack.extend(reversed(d))
        else:
            out.append(d)
    return out


def _to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> the upper 16 bits, rounded to nearest even (NaN kept a NaN)."""
    bits = x.astype("<f4").view("<u4").astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2")
    return np.where(np.isnan(x), np.uint16(0x7FC0), rounded).astype("<u2")


def _from_bf16(raw: np.ndarray) -> np.ndarray:
    return (raw.astype("<u4") << 16).view("<f4")


def json_to_raw(datatype: str, shape: list[int], data: Any, where: str) -> bytes:
    """An input's JSON `data` as the bytes raw_input_contents carries."""
    n = _elements(shape)
    if datatype == "BYTES":
        items = _flat(data) if isinstance(data, list) else [data]
        if len(items) != n:
            raise InvalidArgument(f"{where}: {len(items)} elements in 'data' for shape {shape} ({n} elements)")
        if not all(isinstance(s, str) for s in items):
            raise InvalidArgument(f"{where}: BYTES elements in JSON must be strings (send other bytes as binary data)")
        return pack_bytes([s.encode() for s in items])
    try:
        arr = np.asarray(data)
    except (ValueError, TypeError) as e:
        raise InvalidArgument(f"{where}: 'data' is not a regular (non-ragged) array: {e}") from None
    if arr.size != n:
        raise InvalidArgument(f"{where}: {arr.size} elements in 'data' for shape {shape} ({n} elements)")
    if n == 0:
        return b""
    kind, dt = arr.dtype.kind, NUMPY[datatype]
    if datatype == "BOOL":
        if kind != "b":
            raise InvalidArgument(f"{where}: BOOL data must be true/false")
        return arr.astype(np.bool_).tobytes()
    if dt.kind in "iu" and datatype != "BF16":
        if kind not in "iu":  # numpy made floats or objects of it: past int64, or not all integers
            items = _flat(data) if isinstance(data, list) else [data]
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in items):
                raise InvalidArgument(f"{where}: {datatype} data must be integers")
            lo, hi = min(items), max(items)
        else:
            items, lo, hi = [], int(arr.min()), int(arr.max())
        info = np.iinfo(dt)
        if lo < info.min or hi > info.max:
            raise InvalidArgument(f"{where}: a value is out of the {datatype} range [{info.min}, {info.max}]")
        return (np.array(items, dtype=dt) if items else arr.astype(dt)).tobytes()
    if kind not in "iuf":  # strings, nulls, objects, booleans for a float type
        raise InvalidArgument(f"{where}: {datatype} data must be numbers")
    with np.errstate(over="ignore"):  # past the type's range is inf, as a cast on any v2 server
        if datatype == "BF16":
            return _to_bf16(arr.astype(np.float32)).tobytes()
        return arr.astype(dt).tobytes()


def _check_raw(datatype: str, shape: list[int], raw: bytes, where: str) -> None:
    n = _elements(shape)
    if datatype == "BYTES":
        got = len(unpack_bytes(raw, where))
        if got != n:
            raise InvalidArgument(f"{where}: {got} BYTES elements in the binary data for shape {shape} ({n} elements)")
        return
    want = n * NUMPY[datatype].itemsize
    if len(raw) != want:
        raise InvalidArgument(f"{where}: {len(raw)} bytes of binary data, but {datatype} {shape} takes {want}")


def infer_request(model: str, version: str, obj: dict[str, Any],
                  tail: bytes | memoryview) -> tuple[pb.ModelInferRequest, OutputFormat]:
    """A v2 REST inference request (its JSON object and binary tail) as a ModelInferRequest."""
    req = pb.ModelInferRequest(model_name=model, model_version=version)
    rid = obj.get("id", "")
    if not isinstance(rid, str):
        raise InvalidArgument("'id' must be a string")
    req.id = rid
    params = _params_obj(obj, "request")
    fmt = OutputFormat(binary_default=params.get(BINARY_OUT) is True)
    set_params(req.parameters, params, "request", skip=(BINARY_OUT,))
    inputs = obj.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise InvalidArgument("'inputs' must be a non-empty list")
    offset = 0
    for i, t in enumerate(inputs):
        if not isinstance(t, dict):
            raise InvalidArgument(f"inputs[{i}] must be a JSON object")
        name = _str(t, "name", f"inputs[{i}]")
        where = f"input {shown(name)}"
        datatype = _str(t, "datatype", where)
        if datatype not in DATATYPES:
            raise InvalidArgument(f"{where}: unknown datatype {shown(datatype)}; one of {', '.join(sorted(DATATYPES))}")
        shape = _shape(t, shown(name))
        tp = _params_obj(t, where)
        if any(k in tp for k in _NO_SHM):
            raise InvalidArgument(f"{where}: shared memory is not served through the router; send the data")
        size = tp.get(BINARY_SIZE)
        if size is not None:
            if "data" in t:
                raise InvalidArgument(f"{where}: has both 'data' and {BINARY_SIZE}")
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise InvalidArgument(f"{where}: {BINARY_SIZE} must be a non-negative integer")
            if offset + size > len(tail):
                raise InvalidArgument(f"{where}: {BINARY_SIZE} {size} runs past the binary data "
                                      f"({len(tail) - offset} bytes left after the JSON header)")
            raw = bytes(tail[offset:offset + size])
            offset += size
            _check_raw(datatype, shape, raw, where)
        elif "data" in t:
            raw = json_to_raw(datatype, shape, t["data"], where)
        else:
            raise InvalidArgument(f"{where}: no 'data' and no {BINARY_SIZE} parameter")
        tensor = req.inputs.add(name=name, datatype=datatype, shape=shape)
        set_params(tensor.parameters, tp, where, skip=(BINARY_SIZE,))
        req.raw_input_contents.append(raw)
    if offset != len(tail):
        raise InvalidArgument(f"{len(tail) - offset} bytes of binary data after the last binary input "
                              f"({HEADER_LENGTH} or a {BINARY_SIZE} is wrong)")
    outputs = obj.get("outputs", [])
    if not isinstance(outputs, list):
        raise InvalidArgument("'outputs' must be a list")
    for i, o in enumerate(outputs):
        if not isinstance(o, dict):
            raise InvalidArgument(f"outputs[{i}] must be a JSON object")
        name = _str(o, "name", f"outputs[{i}]")
        op = _params_obj(o, f"output {shown(name)}")
        if any(k in op for k in _NO_SHM):
            raise InvalidArgument(f"output {shown(name)}: shared memory is not served through the router")
        if BINARY in op:
            fmt.binary[name] = op[BINARY] is True
        set_params(req.outputs.add(name=name).parameters, op, f"output {shown(name)}", skip=(BINARY,))
    return req, fmt


# -- inference responses ----------------------------------------------------------------------------------


def _raw_of(t, raw: bytes | None, where: str) -> bytes:
    """An output's bytes: raw_output_contents when the answer has them, else its typed contents packed."""
    if raw is not None:
        return raw
    if t.datatype not in _CONTENTS:
        raise InvalidArgument(f"{where}: {t.datatype} output without raw contents")
    values = list(getattr(t.contents, _CONTENTS[t.datatype]))
    if t.datatype == "BYTES":
        return pack_bytes(values)
    return np.asarray(values).astype(NUMPY[t.datatype]).tobytes()


def raw_to_json(datatype: str, raw: bytes, where: str) -> list[Any]:
    """An output's bytes as a flat JSON list."""
    if datatype == "BYTES":
        try:
            return [b.decode("utf-8") for b in unpack_bytes(raw, where)]
        except UnicodeDecodeError:
            raise InvalidArgument(f"{where} holds bytes that are not UTF-8 text; request it with "
                                  f"parameters {{\"{BINARY}\": true}}") from None
    if datatype not in NUMPY:
        raise InvalidArgument(f"{where}: unknown datatype {shown(datatype)}")
    dt = NUMPY[datatype]
    if len(raw) % dt.itemsize:
        raise InvalidArgument(f"{where}: {len(raw)} bytes is not a whole number of {datatype} elements")
    arr = np.frombuffer(raw, dtype=dt)
    if datatype == "BF16":
        arr = _from_bf16(arr)
    return arr.tolist()


def infer_response(resp: pb.ModelInferResponse, fmt: OutputFormat) -> tuple[bytes, int | None]:
    """(body, JSON header length or None) of the REST answer to `resp`."""
    out: dict[str, Any] = {"model_name": resp.model_name, "model_version": resp.model_version}
    if resp.id:
        out["id"] = resp.id
    if resp.parameters:
        out["parameters"] = get_params(resp.parameters)
    tensors, binaries = [], []
    raws: list[bytes | None] = list(resp.raw_output_contents)
    for i, t in enumerate(resp.outputs):
        where = f"output {shown(t.name)}"
        raw = _raw_of(t, raws[i] if i < len(raws) else None, where)
        params = get_params(t.parameters)
        j: dict[str, Any] = {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}
        if fmt.wants_binary(t.name):
            params[BINARY_SIZE] = len(raw)
            binaries.append(raw)
        else:
            j["data"] = raw_to_json(t.datatype, raw, where)
        if params:
            j["parameters"] = params
        tensors.append(j)
    out["outputs"] = tensors
    head = dumps(out)
    if not binaries:
        return head, None
    return head + b"".join(binaries), len(head)


# -- the other calls ----------------------------------------------------------------------------------------


def message_json(msg: Message) -> dict[str, Any]:
    """A response message as Triton's REST answers carry it: proto field names, every field, 64-bit integers
    as numbers, enums by name."""
    return json_format.MessageToDict(msg, always_print_fields_with_no_presence=True, preserving_proto_field_name=True,
                                     unquote_int64_if_possible=True)


def stats_json(resp: pb.ModelStatisticsResponse) -> dict[str, Any]:
    """Statistics with every duration present, zeros included, as Triton answers them."""
    out = pb.ModelStatisticsResponse()
    out.CopyFrom(resp)
    for s in out.model_stats:
        for group in (s.inference_stats, *s.batch_stats):
            for f in group.DESCRIPTOR.fields:
                if f.message_type is not None:
                    getattr(group, f.name).SetInParent()
    return message_json(out)


def index_request(obj: dict[str, Any]) -> pb.RepositoryIndexRequest:
    ready = obj.get("ready", False)
    if not isinstance(ready, bool):
        raise InvalidArgument("'ready' must be true or false")
    return pb.RepositoryIndexRequest(ready=ready)


def index_json(resp: pb.RepositoryIndexResponse) -> list[dict[str, Any]]:
    return [message_json(m) for m in resp.models]


def _repo_params(target, obj: dict[str, Any], where: str) -> None:
    for k, v in _params_obj(obj, where).items():
        p = target[k]
        if k.startswith("file:"):  # Triton: a model file's bytes, base64 in JSON
            if not isinstance(v, str):
                raise InvalidArgument(f"{where} parameter {shown(k)} must be base64 text")
            try:
                p.bytes_param = base64.b64decode(v, validate=True)
            except (binascii.Error, ValueError):
                raise InvalidArgument(f"{where} parameter {shown(k)} is not valid base64") from None
        elif isinstance(v, bool):
            p.bool_param = v
        elif isinstance(v, int) and -_INT64_MAX - 1 <= v <= _INT64_MAX:
            p.int64_param = v
        elif isinstance(v, str):
            p.string_param = v
        else:
            raise InvalidArgument(f"{where} parameter {shown(k)} must be a boolean, 64-bit integer or string")


def load_request(model: str, obj: dict[str, Any]) -> pb.RepositoryModelLoadRequest:
    req = pb.RepositoryModelLoadRequest(model_name=model)
    _repo_params(req.parameters, obj, "load")
    return req


def unload_request(model: str, obj: dict[str, Any]) -> pb.RepositoryModelUnloadRequest:
    req = pb.RepositoryModelUnloadRequest(model_name=model)
    _repo_params(req.parameters, obj, "unload")
    return req
