"""ModelInfer's request read without copying its raw tensors.

Parsed by protobuf, a request's `raw_input_contents` are copied twice on the event loop before a tensor
exists: once into the parsed message, once more when each bytes value is read out of it (8 MiB: about
10 ms of loop time per copy on a busy 2-core host, measured with py-spy during bench/storms.py's 64 x 8 MB
storm, when the loop was busy 97% of the time and every other tenant's request waited behind it). Here a
large body is split instead (ground/protowire.py): the raw values stay views into the bytes gRPC handed
over, and protobuf parses only the rest (names, shapes, parameters: a few hundred bytes). Tensors are then
np.frombuffer views of those bytes (hostd/tensors.py); a view the runtime cannot take as it is (unaligned for
its type) is copied in the worker thread that runs the batch, where numpy copies without holding the GIL.

Small bodies go to protobuf whole: below SPLIT_FROM the copies cost less than scanning in Python. So does a
large body without raw values (typed contents): there is nothing to keep out of protobuf's copy.

The deserializer runs inside the error boundary's wrapper (ground/interceptors.py), in the call's own task;
RAW_INPUTS carries the views from it to the handler of that same call (as WIRE_BYTES carries the size)."""

from __future__ import annotations

import contextvars

from google.protobuf.message import DecodeError

from ground.protowire import Malformed, split_bytes_field
from ground.wire import SERVICE
from protos import grpc_service_pb2 as pb

RAW_FIELD = pb.ModelInferRequest.RAW_INPUT_CONTENTS_FIELD_NUMBER  # 7
SPLIT_FROM = 256 * 1024  # bytes: smaller bodies are parsed whole

# this call's raw input values as views into its body, or None when the body was parsed whole
RAW_INPUTS: contextvars.ContextVar[list[memoryview] | None] = contextvars.ContextVar("mmhost_raw_inputs", default=None)


def parse_infer_request(body: bytes) -> pb.ModelInferRequest:
    """The request without its raw contents when the body is large and has some (they are in RAW_INPUTS),
    else whole. Raises DecodeError for a body protobuf would refuse."""
    if len(body) < SPLIT_FROM:
        RAW_INPUTS.set(None)
        return pb.ModelInferRequest.FromString(body)
    try:
        raw, rest = split_bytes_field(body, RAW_FIELD)
    except Malformed as e:
        raise DecodeError(str(e)) from None
    if not raw:  # typed contents, no raw values: joining the rest would copy the whole body for nothing
        RAW_INPUTS.set(None)
        return pb.ModelInferRequest.FromString(body)
    req = pb.ModelInferRequest.FromString(b"".join(rest))
    RAW_INPUTS.set(raw)
    return req


DECODERS = {f"/{SERVICE}/ModelInfer": parse_infer_request}  # for ErrorInterceptor
