"""The tenant's side of an upload: `mmhost upload --router HOST:PORT --api-key KEY`. The model file is streamed to
the router's Uploads service (protos/uploads.proto, router/uploads.py) in chunks, with its size and sha256 in
the header; the router validates and publishes it under the key's tenant. No store credential is involved."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc

from ground.hashing import sha256_file
from ground.manifest import TensorSpec
from ground.wire import UPLOADS_SERVICE, reason_of
from protos import uploads_pb2 as pb

CHUNK = 1 << 20


class PublishFailed(Exception):
    """The router refused the upload (or could not be reached): `code` and `reason` say why."""

    def __init__(self, code: str, message: str, reason: str | None = None) -> None:
        super().__init__(f"{code}: {message}" + (f" ({reason})" if reason and reason != code.lower() else ""))
        self.code, self.reason = code, reason


@dataclass
class RouterTarget:
    address: str
    api_key: str
    tls_ca: Path | None = None  # None: the system's roots (unless plaintext)
    plaintext: bool = False
    timeout_s: float | None = None

    def channel(self) -> grpc.Channel:
        if self.plaintext:
            return grpc.insecure_channel(self.address)
        if self.tls_ca is not None:
            from ground.tls import channel_credentials

            return grpc.secure_channel(self.address, channel_credentials(self.tls_ca))
        return grpc.secure_channel(self.address, grpc.ssl_channel_credentials())


def digest(path: Path) -> tuple[int, str]:
    """(size, sha256) of the bytes read, in one pass."""
    n = 0

    def count(k: int) -> None:
        nonlocal n
        n += k

    sha = sha256_file(path, count)
    return n, sha


def _spec(t: TensorSpec) -> pb.TensorSpec:
    return pb.TensorSpec(name=t.name, datatype=t.datatype, shape=t.shape)


def header(file: Path, model: str, *, version: str | None = None, fmt: str | None = None,
           inputs: list[TensorSpec] = (), outputs: list[TensorSpec] = (), max_batch_size: int | None = None,
           instance_count: int = 0, max_queue_delay_us: int = 0, description: str = "", uploaded_by: str = "",
           config: dict | None = None) -> pb.PublishHeader:
    size, sha = digest(file)
    h = pb.PublishHeader(model=model, version=version or "", format=fmt or "", inputs=[_spec(t) for t in inputs],
                         outputs=[_spec(t) for t in outputs], instance_count=instance_count,
                         max_queue_delay_us=max_queue_delay_us, description=description, uploaded_by=uploaded_by,
                         config_json=json.dumps(config) if config else "", size_bytes=size, sha256=sha)
    if max_batch_size is not None:
        h.max_batch_size = max_batch_size
    return h


def requests(h: pb.PublishHeader, file: Path, progress: Callable[[int], None] | None = None,
             chunk_size: int = CHUNK) -> Iterator[pb.PublishRequest]:
    yield pb.PublishRequest(header=h)
    with open(file, "rb") as f:
        while chunk := f.read(chunk_size):
            yield pb.PublishRequest(chunk=chunk)
            if progress:
                progress(len(chunk))


def publish(target: RouterTarget, h: pb.PublishHeader, file: Path,
            progress: Callable[[int], None] | None = None) -> pb.PublishResponse:
    """Stream `file` with header `h`; the router's answer, or PublishFailed."""
    with target.channel() as channel:
        call = channel.stream_unary(f"/{UPLOADS_SERVICE}/Publish", request_serializer=pb.PublishRequest.SerializeToString,
                                    response_deserializer=pb.PublishResponse.FromString)
        try:
            return call(requests(h, file, progress), metadata=(("authorization", f"Bearer {target.api_key}"),),
                        timeout=target.timeout_s)
        except grpc.RpcError as e:
            code = e.code()
            name = code.name if code is not None else "UNKNOWN"
            if code == grpc.StatusCode.UNIMPLEMENTED:
                raise PublishFailed(name, f"the router at {target.address} does not take uploads (uploads=false)") from None
            raise PublishFailed(name, e.details() or "", reason_of(e.trailing_metadata())) from None
