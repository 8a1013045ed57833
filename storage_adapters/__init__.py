"""One storage interface for model bytes and manifests, one module per backend."""

from storage_adapters.base import (
    ObjectInfo,
    ObjectNotFound,
    ProgressFn,
    Storage,
    StorageError,
    StorageUnavailable,
)
from storage_adapters.factory import open_storage

__all__ = [
    "ObjectInfo",
    "ObjectNotFound",
    "ProgressFn",
    "Storage",
    "StorageError",
    "StorageUnavailable",
    "open_storage",
]
