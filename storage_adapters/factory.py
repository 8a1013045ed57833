"""Pick a storage backend from a URI: a path or file:// is a local folder, s3://bucket/prefix is object storage."""

from __future__ import annotations

from typing import TYPE_CHECKING

from storage_adapters.base import Storage

if TYPE_CHECKING:
    from ground.settings import S3Settings


def open_storage(uri: str, s3: S3Settings | None = None) -> Storage:
    if uri.startswith("s3://"):
        from storage_adapters.s3 import S3Storage  # boto3 is imported only when S3 is used

        from ground.settings import S3Settings as _S3

        return S3Storage.from_uri(uri, s3 or _S3())
    if uri.startswith("file://"):
        uri = uri[len("file://") :]
    from storage_adapters.local import LocalStorage

    return LocalStorage(uri)
