"""Pick a storage backend from a URI: a path or file:// is a local folder, s3://bucket/prefix is object storage.

Anything else is refused here, before a byte is written: an unknown scheme (gs://, azure://, http://) or a
malformed s3 URI (s3:/bucket, s3:bucket, s3://) would otherwise be taken for a local folder named 'gs:'.
Other clouds are reached through their S3-compatible endpoints (docs/storage.md, "Other clouds").
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from storage_adapters.base import Storage

if TYPE_CHECKING:
    from ground.settings import S3Settings

SUPPORTED_FORMS = "a folder path (./models, /srv/models), file:///abs/path, or s3://bucket[/prefix]"
_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*):")
_BUCKET_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.\-_]*$")
_OTHER_CLOUDS = {
    "gs": "Google Cloud Storage",
    "gcs": "Google Cloud Storage",
    "az": "Azure Blob Storage",
    "azure": "Azure Blob Storage",
    "abfs": "Azure Blob Storage",
    "abfss": "Azure Blob Storage",
    "wasb": "Azure Blob Storage",
    "wasbs": "Azure Blob Storage",
}


class StorageURIError(ValueError):
    """A --store value that names no supported store. The message says which forms are supported."""


def _refuse(uri: str, why: str) -> StorageURIError:
    return StorageURIError(f"store {uri!r}: {why}; supported: {SUPPORTED_FORMS}")


def check_store_uri(uri: str) -> tuple[str, str]:
    """('s3', uri) or ('local', folder path) for a supported URI; StorageURIError for anything else."""
    if not uri or not uri.strip():
        raise _refuse(uri, "empty")
    m = _SCHEME_RE.match(uri)
    if m is None or len(m.group(1)) == 1:  # no scheme (or a drive letter): a folder path
        return "local", uri
    scheme = m.group(1)
    rest = uri[m.end() :]
    if scheme == "s3":
        if not rest.startswith("//"):
            raise _refuse(uri, f"malformed s3 URI (did you mean 's3://{rest.lstrip('/')}'?)")
        bucket = rest[2:].partition("/")[0]
        if not bucket:
            raise _refuse(uri, "an s3 URI needs a bucket name")
        if not _BUCKET_RE.match(bucket):
            raise _refuse(uri, f"{bucket!r} is not a valid bucket name")
        return "s3", uri
    if scheme == "file":
        if not rest.startswith("///"):
            raise _refuse(uri, "a file URI needs an absolute path (three slashes: file:///srv/models)")
        return "local", rest[2:]
    if scheme.lower() in ("s3", "file"):
        raise _refuse(uri, f"URI schemes are lowercase ({scheme.lower()}:// rather than {scheme}://)")
    cloud = _OTHER_CLOUDS.get(scheme.lower())
    if cloud:
        raise _refuse(
            uri,
            f"{cloud} is reached through its S3-compatible endpoint: use s3://bucket[/prefix] with --s3-endpoint "
            "(or MMHOST_S3_ENDPOINT_URL) and that endpoint's access keys (docs/storage.md, 'Other clouds')",
        )
    hint = "" if rest.startswith("/") else f" (a folder whose name contains ':' can be written ./{uri})"
    raise _refuse(uri, f"unknown scheme {scheme + ':'!r}{hint}")


def open_storage(uri: str, s3: S3Settings | None = None) -> Storage:
    kind, where = check_store_uri(uri)
    if kind == "s3":
        from storage_adapters.s3 import S3Storage  # boto3 is imported only when S3 is used

        from ground.settings import S3Settings as _S3

        return S3Storage.from_uri(where, s3 or _S3())
    from storage_adapters.local import LocalStorage

    return LocalStorage(where)
