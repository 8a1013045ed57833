"""Model sizes from the model store (`mmhost sim ... --sizes-from URI`): each replayed model version's stored
size, read from its manifest (the size a hostd reports in `mmhost-served`), for access logs that carry no
size (older routers) or to check the ones that do. A model the store does not have keeps the trace's size."""

from __future__ import annotations

from collections.abc import Iterable

from catalog.repository import ModelNotFound, ModelRepository
from ground.settings import S3Settings
from storage_adapters.factory import open_storage


def store_sizes(uri: str, keys: Iterable[str], s3: S3Settings | None = None) -> dict[str, int]:
    """key ("tenant/model/version") -> the version's stored bytes; a version "" is the one the store
    resolves (its version policy's latest)."""
    repo = ModelRepository(open_storage(uri, s3 or S3Settings()))
    out: dict[str, int] = {}
    for key in keys:
        tenant, model, version = key.split("/", 2)
        try:
            m = repo.manifest(tenant, model, version) if version else repo.resolve(tenant, model)
        except (ModelNotFound, LookupError):
            continue
        out[key] = m.total_bytes
    return out
