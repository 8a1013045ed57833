"""The frames of HostdData.Infer (protos/hostd_data.proto): a router's ModelInfer calls to one hostd, many to a
stream (router/host_streams.py, hostd/forwarded.py). The request and response bytes go in and out of a frame
as they are, never parsed or copied by protobuf: the frame's small fields are a protobuf message of their own
and the bytes follow as field 15 (protobuf reads fields in any order, so a frame is still that message).

A message on the stream is a batch (ForwardedCalls / ForwardedAnswers): the frames that were waiting when the
writer came to write, each as field 1 (`join`), read back as views (`frames`). A writer never waits for more,
and stops adding frames once a batch holds BATCH_BYTES (`take`): a message must stay under the receiving side's
gRPC message limit (hostd: max_request_bytes + 1 MiB; router: max_message_bytes), which one frame alone
already does, as its unary call would.
"""

from __future__ import annotations

from collections.abc import Sequence

from google.protobuf.message import DecodeError

from ground.protowire import Malformed, encode_varint, split_bytes_field
from protos import hostd_data_pb2 as hd

METHOD = "/mmhost.hostd.HostdData/Infer"
SERVICE_NAME = "mmhost.hostd.HostdData"
_BYTES = bytes([15 << 3 | 2])  # the tag of field 15 (length-delimited) in both frames
_FRAME = bytes([1 << 3 | 2])  # the tag of field 1 (length-delimited): a frame in a batch


BATCH_BYTES = 1 << 20  # a batch takes no more frames once it holds this many bytes


def take(queue: list[bytes], limit: int = BATCH_BYTES) -> list[bytes]:
    """The first frames of `queue` (removed from it) for one message: at least one, and no more once they hold
    `limit` bytes."""
    size = 0
    for n, f in enumerate(queue):
        size += len(f)
        if size >= limit:
            batch = queue[:n + 1]
            del queue[:n + 1]
            return batch
    batch = queue[:]
    queue.clear()
    return batch


def join(frames: Sequence[bytes]) -> bytes:
    """One message of the stream carrying `frames`, in order."""
    parts: list[bytes] = []
    for f in frames:
        parts += (_FRAME, encode_varint(len(f)), f)
    return b"".join(parts)


def frames(message: bytes) -> list[memoryview]:
    """The frames of one message of the stream, as views into it. Raises Malformed."""
    values, rest = split_bytes_field(message, 1)
    if rest:
        raise Malformed("a batch carries frames only")
    return values


def encode_call(seq: int, tenant: str, timeout_us: int, request: bytes) -> bytes:
    head = hd.ForwardedCall(seq=seq, tenant=tenant, timeout_us=timeout_us).SerializeToString()
    return b"".join((head, _BYTES, encode_varint(len(request)), request))


def decode_call(frame: bytes | memoryview) -> tuple[hd.ForwardedCall, memoryview]:
    """(the call's small fields, its request as a view into `frame`). Raises Malformed."""
    return _split(frame, hd.ForwardedCall)


def encode_answer(seq: int, code: int, message: str, trailers: Sequence[tuple[str, str]], response: bytes) -> bytes:
    head = hd.ForwardedAnswer(seq=seq, code=code, message=message,
                              trailers=[hd.Trailer(key=k, value=v) for k, v in trailers]).SerializeToString()
    if not response:
        return head
    return b"".join((head, _BYTES, encode_varint(len(response)), response))


def decode_answer(frame: bytes | memoryview) -> tuple[hd.ForwardedAnswer, memoryview]:
    """(the answer's small fields, its response as a view into `frame`). Raises Malformed."""
    return _split(frame, hd.ForwardedAnswer)


def _split(frame: bytes | memoryview, kind):
    try:
        values, rest = split_bytes_field(frame, 15)
        head = kind.FromString(b"".join(rest))
    except DecodeError as e:
        raise Malformed(str(e)) from None
    if len(values) > 1:
        raise Malformed("a frame carries one message")
    return head, values[0] if values else memoryview(b"")
