"""Object storage through boto3: AWS S3 or any S3-compatible endpoint (MinIO, Ceph, R2).

Endpoint, region and addressing style come from S3Settings; credentials from the standard AWS chain.
Large objects move through s3transfer's managed transfers (parallel ranged GETs, multipart uploads);
transient errors retry inside botocore (standard mode, with backoff), never in a loop here. Every failure
is translated into a StorageError subclass whose message names the store and the cause.

One botocore client per S3Storage; botocore clients are thread-safe, so hostd's worker threads share it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

from urllib3.exceptions import HTTPError

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionError as BotoConnectionError,
    HTTPClientError,
    NoCredentialsError,
    PartialCredentialsError,
)

from ground.settings import S3Settings
from storage_adapters.base import (
    ObjectInfo,
    ObjectNotFound,
    ProgressFn,
    ReadyFn,
    Storage,
    StorageError,
    StorageUnavailable,
)

_NOT_FOUND = {"404", "NoSuchKey", "NotFound"}
_CREDENTIALS = {
    "403",
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "InvalidClientTokenId",
    "ExpiredToken",
    "InvalidToken",
    "AuthorizationHeaderMalformed",
}


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """'s3://bucket/some/prefix' -> ('bucket', 'some/prefix/'); the prefix is '' or ends with '/'."""
    if not uri.startswith("s3://"):
        raise ValueError(f"not an s3:// URI: {uri!r}")
    bucket, _, prefix = uri[len("s3://") :].partition("/")
    if not bucket:
        raise ValueError(f"{uri!r}: no bucket name")
    prefix = prefix.strip("/")
    return bucket, (prefix + "/" if prefix else "")


_CHUNK = 1 << 20
_LOOPBACK = {"localhost", "127.0.0.1", "::1"}


def ranged_get_min_bytes(settings: S3Settings) -> int:
    """The object size from which reads into memory use parallel ranged GETs; 0 means never (see
    S3Settings.ranged_get_min_bytes)."""
    if settings.ranged_get_min_bytes is not None:
        return settings.ranged_get_min_bytes
    host = urlsplit(settings.endpoint_url).hostname if settings.endpoint_url else None
    if host is not None and (host in _LOOPBACK or host.startswith("127.")):
        return 0
    return settings.multipart_threshold


class _Stopped(Exception):
    """Another part of the same read failed: this one stops early."""


def _root_cause(exc: BaseException) -> BaseException:
    """s3transfer and boto3 wrap botocore errors (S3UploadFailedError, futures); find the botocore one."""
    seen = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, (ClientError, BotoCoreError)):
            return cur
        cur = cur.__cause__ or cur.__context__
    return exc


class S3Storage(Storage):
    def __init__(self, bucket: str, prefix: str, settings: S3Settings) -> None:
        self.bucket = bucket
        self.prefix = prefix if not prefix or prefix.endswith("/") else prefix + "/"
        self.settings = settings
        where = settings.endpoint_url or f"AWS S3 ({settings.region})"
        self.endpoint = where
        self.description = f"s3://{bucket}/{self.prefix} at {where}"
        config = Config(
            region_name=settings.region,
            s3={"addressing_style": settings.addressing_style},
            retries={"mode": "standard", "max_attempts": settings.max_attempts},
            connect_timeout=settings.connect_timeout_s,
            read_timeout=settings.read_timeout_s,
            max_pool_connections=max(10, settings.max_concurrency * 2),
            request_checksum_calculation=settings.checksums,
            response_checksum_validation=settings.checksums,
        )
        # A session of our own: boto3's default session is module-global and not thread-safe.
        session = boto3.session.Session()
        self._client = session.client("s3", endpoint_url=settings.endpoint_url, config=config)
        self._transfer = TransferConfig(
            multipart_threshold=settings.multipart_threshold,
            multipart_chunksize=settings.multipart_chunksize,
            max_concurrency=settings.max_concurrency,
            io_chunksize=1 << 20,  # fewer, larger writes to the local file than the 256 KiB default
            num_download_attempts=2,  # stream errors mid-part; connection errors already retry in botocore
            use_threads=True,
        )
        # botocore reads the paginators' model on first use: here, not on a model's first (cold) load
        self._client.get_paginator("list_objects_v2")
        self._ranged_min = ranged_get_min_bytes(settings)
        self._parts_pool: ThreadPoolExecutor | None = None
        self._parts_lock = threading.Lock()

    @classmethod
    def from_uri(cls, uri: str, settings: S3Settings) -> S3Storage:
        bucket, prefix = parse_s3_uri(uri)
        return cls(bucket, prefix, settings)

    @property
    def client(self):
        """The botocore client (for event hooks in tests and benchmarks)."""
        return self._client

    # -- errors ---------------------------------------------------------------------------------------

    def _error(self, exc: BaseException, action: str, key: str | None = None) -> StorageError:
        cause = _root_cause(exc)
        what = f"{action} {key!r}" if key is not None else action
        if isinstance(cause, ClientError):
            err = cause.response.get("Error", {})
            code = str(err.get("Code", ""))
            status = str(cause.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
            msg = err.get("Message") or code
            if code == "NoSuchBucket":
                return StorageUnavailable(f"{self.description}: bucket {self.bucket!r} does not exist ({what})")
            if code in _NOT_FOUND or status == "404":
                return ObjectNotFound(f"{self.description}: no object {key!r}")
            if code in _CREDENTIALS or status == "403":
                return StorageUnavailable(
                    f"{self.description}: credentials refused while trying to {what}: {code}: {msg}"
                )
            if status.startswith("5") or code in ("SlowDown", "ServiceUnavailable", "InternalError"):
                return StorageUnavailable(f"{self.description}: storage error while trying to {what}: {code}: {msg}")
            return StorageError(f"{self.description}: cannot {what}: {code}: {msg}")
        if isinstance(cause, (NoCredentialsError, PartialCredentialsError)):
            return StorageUnavailable(f"{self.description}: no usable AWS credentials ({cause}); cannot {what}")
        if isinstance(cause, (BotoConnectionError, HTTPClientError)):
            return StorageUnavailable(f"{self.description}: cannot reach storage at {self.endpoint} to {what}: {cause}")
        if isinstance(cause, BotoCoreError):
            return StorageUnavailable(f"{self.description}: cannot {what}: {cause}")
        if isinstance(cause, OSError):
            return StorageError(f"{self.description}: cannot {what}: {cause}")
        return StorageError(f"{self.description}: cannot {what}: {type(cause).__name__}: {cause}")

    # -- reads ----------------------------------------------------------------------------------------

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        full = self.prefix + prefix
        try:
            pages = self._client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=full)
            for page in pages:
                for obj in page.get("Contents", []):
                    yield ObjectInfo(obj["Key"][len(self.prefix) :], int(obj["Size"]))
        except (ClientError, BotoCoreError) as e:
            raise self._error(e, "list", prefix) from e

    def list_dirs(self, prefix: str) -> list[str]:
        full = self.prefix + prefix
        if full and not full.endswith("/"):
            full += "/"
        out: list[str] = []
        try:
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=full, Delimiter="/"
            )
            for page in pages:
                for cp in page.get("CommonPrefixes", []):
                    name = cp["Prefix"][len(full) :].rstrip("/")
                    if name:
                        out.append(name)
        except (ClientError, BotoCoreError) as e:
            raise self._error(e, "list", prefix) from e
        return sorted(out)

    def stat(self, key: str) -> ObjectInfo:
        try:
            head = self._client.head_object(Bucket=self.bucket, Key=self.prefix + key)
        except (ClientError, BotoCoreError) as e:
            raise self._error(e, "stat", key) from e
        return ObjectInfo(key, int(head["ContentLength"]))

    def read_bytes(self, key: str) -> bytes:
        try:
            resp = self._client.get_object(Bucket=self.bucket, Key=self.prefix + key)
            with resp["Body"] as body:
                return body.read()
        except (ClientError, BotoCoreError) as e:
            raise self._error(e, "read", key) from e

    def download(self, key: str, dest: Path, progress: ProgressFn | None = None, size_hint: int | None = None) -> None:
        """Objects above multipart_threshold come down in parallel ranged GETs of multipart_chunksize
        (s3transfer writes a temporary file next to `dest` and renames it when complete). An object the
        caller knows to be at most the threshold comes down in one streamed GET: no HEAD request and no
        transfer-manager queue, about 3x faster for a single part."""
        dest.parent.mkdir(parents=True, exist_ok=True)
        if size_hint is not None and size_hint <= self._transfer.multipart_threshold:
            self._download_single(key, dest, progress)
            return
        try:
            self._client.download_file(
                self.bucket, self.prefix + key, str(dest), Config=self._transfer, Callback=progress
            )
        except Exception as e:  # s3transfer re-raises worker errors as they were, or wrapped
            raise self._error(e, "download", key) from e

    def _download_single(self, key: str, dest: Path, progress: ProgressFn | None) -> None:
        try:
            body = self._client.get_object(Bucket=self.bucket, Key=self.prefix + key)["Body"]
            try:
                with open(dest, "wb") as f:
                    for chunk in body.iter_chunks(1 << 20):
                        f.write(chunk)
                        if progress:
                            progress(len(chunk))
            finally:
                body.close()
        except Exception as e:  # botocore errors, or a stream cut mid-body
            dest.unlink(missing_ok=True)
            raise self._error(e, "download", key) from e

    def read_into(self, key: str, buf: memoryview, progress: ProgressFn | None = None,
                  ready: ReadyFn | None = None) -> int:
        """Into memory with no temporary file: one GET read straight into `buf`, or, for objects of at least
        ranged_get_min_bytes, parallel ranged GETs of multipart_chunksize written at their offsets (`ready`
        then follows the completed prefix, so hashing stays in order)."""
        n = len(buf)
        chunk = self.settings.multipart_chunksize
        try:
            if not self._ranged_min or n < self._ranged_min or n <= chunk:
                return self._read_single(key, buf, progress, ready)
            return self._read_ranged(key, buf, chunk, progress, ready)
        except StorageError:
            raise
        except Exception as e:  # botocore errors, or urllib3's when the stream breaks mid-body
            raise self._error(e, "download", key) from e

    def _stream_into(self, resp: dict, buf: memoryview, start: int, end: int, progress: ProgressFn | None,
                     ready: ReadyFn | None, stop: threading.Event | None = None) -> None:
        """buf[start:end] from a GetObject response body, read in place (no chunk objects, no copies)."""
        body = resp["Body"]
        raw = getattr(body, "_raw_stream", None)  # urllib3's response: readinto; else botocore's read()
        try:
            self._stream_loop(body, raw, buf, start, end, progress, ready, stop)
        except (BotoCoreError, _Stopped, StorageError):
            raise
        except (HTTPError, OSError) as e:  # the connection broke mid-body (urllib3's own errors, unwrapped)
            raise StorageUnavailable(f"{self.description}: cannot reach storage at {self.endpoint}: the "
                                     f"transfer broke: {type(e).__name__}: {e}") from e
        finally:
            body.close()

    @staticmethod
    def _stream_loop(body, raw, buf: memoryview, start: int, end: int, progress: ProgressFn | None,
                     ready: ReadyFn | None, stop: threading.Event | None) -> None:
        pos = start
        while pos < end:
            if stop is not None and stop.is_set():
                raise _Stopped
            view = buf[pos : min(end, pos + _CHUNK)]
            if raw is not None:
                got = raw.readinto(view)
            else:
                data = body.read(len(view))
                got = len(data)
                view[:got] = data
            if not got:
                raise HTTPError(f"the stream ended after {pos - start} of {end - start} bytes")
            pos += got
            if progress:
                progress(got)
            if ready:
                ready(pos)

    def _read_single(self, key: str, buf: memoryview, progress: ProgressFn | None, ready: ReadyFn | None) -> int:
        resp = self._client.get_object(Bucket=self.bucket, Key=self.prefix + key)
        size = int(resp["ContentLength"])
        self._stream_into(resp, buf, 0, min(size, len(buf)), progress, ready)
        return size

    def _pool(self) -> ThreadPoolExecutor:
        with self._parts_lock:
            if self._parts_pool is None:
                self._parts_pool = ThreadPoolExecutor(self.settings.max_concurrency, thread_name_prefix="s3-part")
            return self._parts_pool

    def _read_ranged(self, key: str, buf: memoryview, chunk: int, progress: ProgressFn | None,
                     ready: ReadyFn | None) -> int:
        n = len(buf)
        bounds = [(a, min(n, a + chunk)) for a in range(0, n, chunk)]
        done = [False] * len(bounds)
        totals: list[int] = []
        lock = threading.Lock()
        stop = threading.Event()
        prefix = 0  # parts complete from the start

        def part(i: int) -> None:
            nonlocal prefix
            a, b = bounds[i]
            try:
                resp = self._client.get_object(Bucket=self.bucket, Key=self.prefix + key, Range=f"bytes={a}-{b - 1}")
            except ClientError as e:
                if str(e.response.get("Error", {}).get("Code")) == "InvalidRange":  # the object is shorter
                    return
                raise
            total = int(str(resp.get("ContentRange", "")).rpartition("/")[2] or -1)
            if total != n:  # another size than expected: stop here, the caller hears the real size
                resp["Body"].close()
                with lock:
                    totals.append(total)
                return
            self._stream_into(resp, buf, a, b, progress, None, stop)
            with lock:
                totals.append(total)
                done[i] = True
                while prefix < len(done) and done[prefix]:
                    prefix += 1
                    if ready:
                        ready(bounds[prefix - 1][1])

        futures = [self._pool().submit(part, i) for i in range(len(bounds))]
        first: BaseException | None = None
        for f in futures:  # every part ends before `buf` goes back to the caller
            try:
                f.result()
            except BaseException as e:  # noqa: BLE001 - the first failure is raised once all parts ended
                stop.set()
                if first is None and not isinstance(e, _Stopped):
                    first = e
        if first is not None:
            raise first
        if all(done):
            return n
        wrong = [t for t in totals if t != n]
        return wrong[0] if wrong and wrong[0] >= 0 else self.stat(key).size

    # -- writes ---------------------------------------------------------------------------------------

    def put_bytes(self, key: str, data: bytes) -> None:
        """A single PUT: S3 makes it visible all at once, so readers see the old object or the new one."""
        try:
            self._client.put_object(Bucket=self.bucket, Key=self.prefix + key, Body=data)
        except (ClientError, BotoCoreError) as e:
            raise self._error(e, "write", key) from e

    def upload_file(self, src: Path, key: str, progress: ProgressFn | None = None) -> None:
        """Files above multipart_threshold go up as a multipart upload, parts in parallel."""
        try:
            self._client.upload_file(str(src), self.bucket, self.prefix + key, Config=self._transfer, Callback=progress)
        except Exception as e:  # boto3 wraps ClientError in S3UploadFailedError
            if isinstance(e, OSError) and not isinstance(_root_cause(e), (ClientError, BotoCoreError)):
                raise StorageError(f"{self.description}: cannot read {src}: {e}") from e
            raise self._error(e, "upload", key) from e

    def delete(self, key: str) -> None:
        try:
            self._client.delete_object(Bucket=self.bucket, Key=self.prefix + key)
        except (ClientError, BotoCoreError) as e:
            err = self._error(e, "delete", key)
            if isinstance(err, ObjectNotFound):
                return
            raise err from e
