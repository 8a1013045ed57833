"""Tenant uploads (protos/uploads.proto, mmhost.uploads.Uploads/Publish): a tenant publishes a model version
with its API key, never with the store's credentials. The router is the only writer a tenant reaches, and the
tenant is the one its credential names (RouterServicer.authenticate, the inference front door): nothing the
client sends names a tenant, so every object written is under tenants/<that tenant>/models/.

Why through the router rather than pre-signed URLs: a pre-signed PUT is scoped to one key, but a tenant could
still upload anything there (a pickle, a 50 GB file, a model that crashes the runtime) and a separate publish
step would have to fetch it back to validate it; here the bytes are checked once, on their way in, and a
refused model never reaches the store. The cost is the router's bandwidth and one worker process per upload,
bounded by upload_concurrency.

One call, in order:
1. Authenticated before anything is read; one upload at a time per tenant and upload_concurrency per router
   (RESOURCE_EXHAUSTED uploads_busy past them).
2. The header (first message): model and version names are path segments (ground.manifest.check_name:
   letters, digits, '_', '-', '.', at most 128; never '/', '..' or NUL): INVALID_ARGUMENT otherwise, before
   any byte of the file. A declared size over upload_max_bytes: RESOURCE_EXHAUSTED upload_too_large at once.
3. The file's chunks go to a temporary file in upload_dir, sha256 computed on the way; the call is refused
   (RESOURCE_EXHAUSTED upload_too_large) as soon as the bytes pass upload_max_bytes, so no more than that is
   ever held. The size and digest must match the header's when it states them. A stream that sends nothing
   for upload_idle_timeout_s is DEADLINE_EXCEEDED (a stalled client does not keep its place), and so is one
   whose file is not whole within upload_idle_timeout_s + (declared size, else upload_max_bytes) /
   MIN_UPLOAD_BYTES_PER_S (`receive_limit_s`): a client trickling a byte just within the idle timeout does
   not keep its place for ever either.
4. Validation in a worker process (`python -m hostd.validate`, the checks of `mmhost upload --store`: safe
   format, self-contained, loads in the runtime that will serve it, runs on zeros), with
   upload_validate_timeout_s, an environment without the router's credentials, and niceness 10. A refusal is
   INVALID_ARGUMENT model_invalid, with the validator's reason. Only the verdict is taken from the worker (it
   parsed a tenant's file, so a crafted one may have taken it over): the manifest must name the key's tenant,
   the model and version asked for, and a plain model file name. Its output is read with a bound: past
   MAX_WORKER_STDOUT bytes of answer or MAX_WORKER_STDERR bytes of diagnostics it is killed and the model
   refused (model_invalid), and only the tail of its stderr is kept. The worker still runs as the router's user:
   a separate user, no network and a seccomp profile would confine it further (not done).
5. Published by catalog.publish (files first, manifest last, with the size and sha256 computed in step 3: the
   file is not read again) under the tenant's prefix, then indexed in the catalog (Redis), and this router's
   directory forgets the name: the model is callable when the call returns. A version that exists already is
   ALREADY_EXISTS version_exists (a version the caller named is checked before validation too).
The temporary file is removed whatever happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import grpc
from google.protobuf.message import DecodeError
from grpc import aio
from pydantic import ValidationError

from catalog.index import CatalogUnavailable, RedisCatalog
from catalog.publish import VersionExists, next_version, publish_version
from catalog.repository import ModelRepository
from ground import async_child
from ground.interceptors import with_error_boundary
from ground.errors import (AlreadyExists, DeadlineExceeded, Internal, InvalidArgument, ResourceExhausted,
                           ServingError, Unavailable, shown)
from ground.manifest import ModelFormat, ModelManifest, TensorSpec, check_name
from ground.settings import RouterSettings
from ground.units import parse_bytes
from ground.wire import UPLOADS_SERVICE, Reason
from protos import uploads_pb2 as pb
from router.directory import ModelDirectory
from router.metrics import RouterMetrics
from storage_adapters.base import StorageError

log = logging.getLogger(__name__)
MAX_HEADER_BYTES = 64 << 10  # names, tensor specs and a config: a header bigger than this is not one
MAX_TENSORS = 256
MAX_TEXT = 1024  # description
MAX_UPLOADED_BY = 128
BUSY_RETRY_MS = 5000
# what the validation worker inherits from the router's environment: how to find Python and its packages,
# and nothing else (no AWS_*, no MMHOST_*: it runs a tenant's model and needs no credential)
WORKER_ENV = ("PATH", "PYTHONPATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "VIRTUAL_ENV", "LD_LIBRARY_PATH")
VALIDATOR = (sys.executable, "-m", "hostd.validate")
# The worker's output, read with a bound (a crafted model may have taken the worker over and flood it): its
# answer (a manifest: names, tensor specs, a config) is far below MAX_WORKER_STDOUT; its stderr (the runtimes'
# warnings) is read up to MAX_WORKER_STDERR and only its last STDERR_TAIL bytes are kept. Past either the
# worker is killed and the model refused (model_invalid).
MAX_WORKER_STDOUT = 1 << 20
MAX_WORKER_STDERR = 16 << 20
STDERR_TAIL = 4096
_READ = 64 << 10
# The slowest upload taken: a file must be whole within upload_idle_timeout_s + its size (declared, else
# upload_max_bytes) at this rate (with the defaults, 1 GiB in about 34 minutes), whatever the gaps between
# messages; a setting of its own would belong in RouterSettings (ground/settings.py).
MIN_UPLOAD_BYTES_PER_S = 512 << 10


class UploadSlots:
    """At most `total` uploads at once, one per tenant: a tenant cannot take every slot, and one tenant's two
    uploads never race for the same version number on one router."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.busy: set[str] = set()

    def acquire(self, tenant: str) -> bool:
        if tenant in self.busy or len(self.busy) >= self.total:
            return False
        self.busy.add(tenant)
        return True

    def release(self, tenant: str) -> None:
        self.busy.discard(tenant)


def worker_env(environ: dict[str, str] | os._Environ = os.environ) -> dict[str, str]:
    env = {k: environ[k] for k in WORKER_ENV if k in environ}
    env["CUDA_VISIBLE_DEVICES"] = ""  # validation runs on the CPU, never on a device a hostd may share
    env["OMP_NUM_THREADS"] = "1"
    return env


class _WorkerFlood(Exception):
    def __init__(self, stream: str, limit: int) -> None:
        super().__init__(stream)
        self.stream, self.limit = stream, limit


def receive_limit_s(declared_size: int, max_bytes: int, idle_s: float) -> float:
    """How long receiving one file may take in all: the idle timeout (to get going) plus its size (the
    header's, else the most it may be) at MIN_UPLOAD_BYTES_PER_S."""
    return idle_s + (declared_size or max_bytes) / MIN_UPLOAD_BYTES_PER_S


def _too_large(limit: int) -> ResourceExhausted:
    return ResourceExhausted(f"the model file is over the upload limit of {limit} bytes",
                             reason=Reason.UPLOAD_TOO_LARGE.value)


def _parse(raw: bytes) -> pb.PublishRequest:
    try:
        return pb.PublishRequest.FromString(raw)
    except DecodeError as e:
        raise InvalidArgument(f"malformed PublishRequest: {e}") from None


def _tensors(specs, what: str) -> list[dict]:
    if len(specs) > MAX_TENSORS:
        raise InvalidArgument(f"too many {what} ({len(specs)}; at most {MAX_TENSORS})")
    try:
        return [TensorSpec(name=t.name, datatype=t.datatype, shape=list(t.shape)).model_dump() for t in specs]
    except ValidationError as e:
        raise InvalidArgument(f"invalid {what}: {e.errors()[0].get('msg', e)}") from None


def read_header(raw: bytes | None, tenant: str, limit: int) -> tuple[pb.PublishHeader, dict]:
    """The first message's header, checked, and the validation worker's request (without file and version).
    Every name that becomes part of an object key is checked here, before any byte of the file is read."""
    if raw is None:
        raise InvalidArgument("empty upload: send a PublishRequest with a header, then the file in chunks")
    if len(raw) > MAX_HEADER_BYTES:
        raise InvalidArgument(f"the first message is {len(raw)} bytes; a header is at most {MAX_HEADER_BYTES}")
    msg = _parse(raw)
    if msg.WhichOneof("part") != "header":
        raise InvalidArgument("the first PublishRequest must carry the header (model, sizes), then the chunks")
    h = msg.header
    for which, value in (("model", h.model), ("version", h.version)):
        if value or which == "model":
            try:
                check_name(which, value)
            except ValueError:
                raise InvalidArgument(f"invalid {which} name {shown(value)}: use letters, digits, '_', '-', '.' "
                                      "(at most 128, starting with a letter or digit)") from None
    if h.size_bytes > limit:
        raise _too_large(limit)
    try:
        fmt = ModelFormat(h.format).value if h.format else None
    except ValueError:
        raise InvalidArgument(f"unknown format {shown(h.format)}: onnx, torchscript or torch_export") from None
    try:
        config = json.loads(h.config_json) if h.config_json else {}
    except ValueError as e:
        raise InvalidArgument(f"config_json is not JSON: {e}") from None
    if not isinstance(config, dict):
        raise InvalidArgument("config_json must be a JSON object (the manifest options of --config)")
    if len(h.description) > MAX_TEXT:
        raise InvalidArgument(f"description is over {MAX_TEXT} characters")
    by = h.uploaded_by[:MAX_UPLOADED_BY]
    request = {
        "tenant": tenant, "model": h.model, "format": fmt,
        "inputs": _tensors(h.inputs, "inputs"), "outputs": _tensors(h.outputs, "outputs"),
        "max_batch_size": h.max_batch_size if h.HasField("max_batch_size") else None,
        "instance_count": h.instance_count or 1, "max_queue_delay_us": h.max_queue_delay_us, "max_bytes": limit,
        "uploaded_by": f"{by} (API key)" if by else "(API key)", "description": h.description, "config": config,
    }
    return h, request


class Uploads:
    def __init__(self, *, settings: RouterSettings, authenticate: Callable[[aio.ServicerContext], str],
                 repo: ModelRepository, catalog, directory: ModelDirectory, metrics: RouterMetrics,
                 validator: tuple[str, ...] = VALIDATOR, clock: Callable[[], float] = time.monotonic) -> None:
        """`catalog`: where a published version is indexed (a RedisCatalog; a StorageCatalog is the store
        itself); `validator`: the worker's command line."""
        self.settings = settings
        self.max_bytes = parse_bytes(settings.upload_max_bytes)
        self.authenticate = authenticate
        self.repo, self.catalog, self.directory = repo, catalog, directory
        self.metrics = metrics
        self.validator = validator
        self.clock = clock
        self.slots = UploadSlots(settings.upload_concurrency)
        self.dir = settings.upload_dir
        if self.dir is not None and not self.dir.is_dir():
            raise ValueError(f"upload_dir {self.dir}: no such folder")

    def handler(self) -> grpc.GenericRpcHandler:
        # raw bytes in (decoded here: INVALID_ARGUMENT for a malformed message, never grpc's UNKNOWN)
        return grpc.method_handlers_generic_handler(UPLOADS_SERVICE, {
            "Publish": with_error_boundary(grpc.stream_unary_rpc_method_handler(self.publish)),
        })

    async def publish(self, request_iterator, context: aio.ServicerContext) -> bytes:
        tenant = self.authenticate(context)  # before a byte of the body is read
        if not self.slots.acquire(tenant):
            self.metrics.uploads.labels(tenant, Reason.UPLOADS_BUSY.value).inc()
            raise ResourceExhausted("uploads are busy (one at a time per tenant); retry later",
                                    retry_after_ms=BUSY_RETRY_MS, reason=Reason.UPLOADS_BUSY.value)
        self.metrics.uploads_in_progress.inc()
        tmp: Path | None = None  # a folder of its own, holding the file under the model's name
        outcome = Reason.INTERNAL.value
        try:
            it = request_iterator.__aiter__()
            header, request = read_header(await self._next(it), tenant, self.max_bytes)
            tmp = Path(tempfile.mkdtemp(prefix="mmhost-upload-", dir=self.dir))
            file = tmp / header.model  # a checked name: validation messages name the tenant's model, not a temp file
            limit_s = receive_limit_s(header.size_bytes, self.max_bytes, self.settings.upload_idle_timeout_s)
            with open(file, "xb") as f:
                size, digest = await self._receive(it, f, tenant, (self.clock() + limit_s, limit_s))
            if header.size_bytes and size != header.size_bytes:
                raise InvalidArgument(f"received {size} bytes, the header said {header.size_bytes}: upload cut short?")
            if header.sha256 and digest != header.sha256.strip().lower():
                raise InvalidArgument("the file's sha256 does not match the header's: corrupted in transit?")
            model = header.model
            if header.version:  # a version named by the caller: refused before the costly validation
                version = header.version
                if version in await self._store(self.repo.versions, tenant, model):
                    raise AlreadyExists(f"model {shown(model)} version {shown(version)} already exists; versions "
                                        "are immutable", reason=Reason.VERSION_EXISTS.value)
            else:  # one past every version folder: not among the versions (publish_version checks again)
                version = await self._store(next_version, self.repo, tenant, model)
            manifest = await self._validate({**request, "file": str(file), "version": version})
            _check_answer(manifest, tenant, model, version)
            try:
                final = await self._store(publish_version, self.repo, manifest, {manifest.model_file: file},
                                          None, {manifest.model_file: (size, digest)})
            except VersionExists as e:
                raise AlreadyExists(str(e), reason=Reason.VERSION_EXISTS.value) from None
            indexed = await self._index(final)
            self.directory.forget(tenant, model)
            outcome = "ok"
            log.info("tenant %s published %s version %s (%s, %d bytes, sha256 %s)%s", tenant, model, final.version,
                     final.format.value, size, digest[:12], "" if indexed else "; not indexed (catalog down)")
            return pb.PublishResponse(model=model, version=final.version, format=final.format.value, size_bytes=size,
                                      sha256=digest, max_batch_size=final.max_batch_size or 0,
                                      indexed=indexed).SerializeToString()
        except ServingError as e:
            outcome = e.wire_reason
            raise
        except asyncio.CancelledError:  # the client went away (or its deadline passed)
            outcome = "cancelled"
            raise
        finally:
            self.slots.release(tenant)
            self.metrics.uploads_in_progress.dec()
            self.metrics.uploads.labels(tenant, outcome).inc()
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)

    async def _receive(self, it, f, tenant: str, deadline: tuple[float, float] | None = None) -> tuple[int, str]:
        """Chunks into `f` until the stream ends; refused as soon as they pass max_bytes, and past `deadline`
        ((when, by self.clock), and its length in seconds)."""
        h = hashlib.sha256()
        n = 0
        bytes_counter = self.metrics.upload_bytes.labels(tenant)
        while (raw := await self._next(it, deadline)) is not None:
            msg = _parse(raw)
            if msg.WhichOneof("part") != "chunk":
                raise InvalidArgument("a second header: send one header, then chunks")
            chunk = msg.chunk
            n += len(chunk)
            bytes_counter.inc(len(chunk))
            if n > self.max_bytes:
                raise _too_large(self.max_bytes)
            await asyncio.to_thread(_absorb, f, h, chunk)
        return n, h.hexdigest()

    async def _next(self, it, deadline: tuple[float, float] | None = None) -> bytes | None:
        """The next message, None at the end of the stream; DeadlineExceeded after upload_idle_timeout_s, or
        once `deadline` ((when, by self.clock), and its length in seconds) has passed."""
        idle = self.settings.upload_idle_timeout_s
        wait, whole = idle, False
        if deadline is not None and deadline[0] - self.clock() < idle:
            wait, whole = max(deadline[0] - self.clock(), 0.0), True
        try:
            return await asyncio.wait_for(it.__anext__(), wait)
        except StopAsyncIteration:
            return None
        except asyncio.TimeoutError:
            if whole:
                assert deadline is not None
                raise DeadlineExceeded(f"the upload was not whole within {deadline[1]:g} s (its size at "
                                       f"{MIN_UPLOAD_BYTES_PER_S} bytes/s, plus {idle:g} s)",
                                       reason=Reason.DEADLINE.value) from None
            raise DeadlineExceeded(f"no upload message for {idle:g} s", reason=Reason.DEADLINE.value) from None

    async def _validate(self, request: dict) -> ModelManifest:
        """The worker's verdict on the model: the manifest to publish, or InvalidArgument model_invalid."""
        started = self.clock()
        try:  # not asyncio's create_subprocess_exec: on uvloop it forks the router (ground/async_child.py)
            proc = await async_child.start(self.validator, worker_env())
        except OSError as e:  # out of processes or memory, or no such program: the router's trouble
            raise Unavailable("model validation could not start; retry later", retry_after_ms=5000,
                              detail=f"starting {self.validator[0]}: {e}") from None
        timeout = self.settings.upload_validate_timeout_s
        out: bytes | None = None
        err = b""
        try:
            out, err = await asyncio.wait_for(_communicate(proc, json.dumps(request).encode()), timeout)
        except asyncio.TimeoutError:
            raise InvalidArgument(f"the model did not load and run on zeros within {timeout:g} s",
                                  reason=Reason.MODEL_INVALID.value) from None
        except _WorkerFlood as e:  # a worker writing without end: taken over, or broken; killed below
            raise InvalidArgument(f"model validation wrote over {e.limit} bytes to {e.stream}",
                                  reason=Reason.MODEL_INVALID.value) from None
        finally:
            if out is None:  # timed out, flooded, or the call was cancelled: the worker goes with it
                _abandon(proc)
                await proc.wait()
            self.metrics.upload_validate_seconds.observe(self.clock() - started)
        tail = err.decode(errors="replace")[-2000:]
        if proc.returncode is not None and proc.returncode < 0:  # killed by a signal: the runtime crashed on it
            raise InvalidArgument(f"the model crashed its runtime while loading (signal {-proc.returncode})",
                                  reason=Reason.MODEL_INVALID.value, detail=tail)
        try:
            answer = json.loads(out)
        except ValueError:
            raise Internal("model validation failed", detail=f"validator exit {proc.returncode}: {tail}") from None
        if "refused" in answer:
            raise InvalidArgument(f"model refused: {answer['refused']}", reason=Reason.MODEL_INVALID.value)
        return ModelManifest.model_validate(answer["manifest"])

    async def _store(self, fn, *args):
        try:
            return await asyncio.to_thread(fn, *args)
        except StorageError as e:
            raise Unavailable("model store unavailable; retry later", retry_after_ms=5000,
                              reason=Reason.STORAGE_DOWN.value, detail=str(e)) from e

    async def _index(self, manifest: ModelManifest) -> bool:
        """Index the new version where the routers look models up. False when Redis could not be reached: the
        version is stored (the truth) and a catalog rebuild indexes it."""
        if not isinstance(self.catalog, RedisCatalog):
            return True  # the store is the catalog
        try:
            await asyncio.to_thread(self.catalog.index_version, manifest)
        except CatalogUnavailable as e:
            log.warning("published %s/%s version %s but could not index it: %s", manifest.tenant, manifest.model,
                        manifest.version, e)
            return False
        return True


def _check_answer(manifest: ModelManifest, tenant: str, model: str, version: str) -> None:
    """The worker parsed a tenant's file: if a crafted model took it over, its answer is the attacker's. Only
    the verdict is taken from it, never where to write: the manifest must name the key's tenant, the model and
    version asked for, and a model file that is one plain path segment."""
    try:
        check_name("file", manifest.model_file)
    except ValueError:
        raise Internal("model validation failed", detail=f"worker named model file {manifest.model_file!r}") from None
    if manifest.key() != (tenant, model, version):
        raise Internal("model validation failed", detail=f"worker answered for {manifest.key()}, "
                       f"not {(tenant, model, version)}")


def _abandon(proc: async_child.AsyncChild) -> None:
    """Kill the worker and close this side of its pipes (its unread output, a flood left paused, or a child
    of it still holding them)."""
    proc.kill()
    proc.close()


async def _communicate(proc: async_child.AsyncChild, data: bytes) -> tuple[bytes, bytes]:
    """proc.communicate(data), with a bound on what is read: stdout up to MAX_WORKER_STDOUT, stderr up to
    MAX_WORKER_STDERR of which the last STDERR_TAIL bytes are kept; _WorkerFlood past either (the caller kills
    the worker)."""

    async def feed(stdin: asyncio.StreamWriter) -> None:
        # a worker that reads nothing, or is gone: its exit code and output tell why (uvloop raises
        # RuntimeError on a write to a pipe already closed, hence the check: no await lies between the two)
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            if not stdin.is_closing():
                stdin.write(data)
                await stdin.drain()
        stdin.close()

    async def read(stream: asyncio.StreamReader, name: str, limit: int, keep: int | None) -> bytes:
        buf = bytearray()
        n = 0
        while chunk := await stream.read(_READ):
            n += len(chunk)
            if n > limit:
                raise _WorkerFlood(name, limit)
            buf += chunk
            if keep is not None and len(buf) > keep:
                del buf[:-keep]
        return bytes(buf)

    tasks = [asyncio.ensure_future(feed(proc.stdin)),
             asyncio.ensure_future(read(proc.stdout, "stdout", MAX_WORKER_STDOUT, None)),
             asyncio.ensure_future(read(proc.stderr, "stderr", MAX_WORKER_STDERR, STDERR_TAIL))]
    try:
        _, out, err = await asyncio.gather(*tasks)
    finally:
        for t in tasks:  # one failed (or this was cancelled): the others stop too
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    await proc.wait()
    return out, err


def _absorb(f, h, chunk: bytes) -> None:
    h.update(chunk)
    f.write(chunk)
