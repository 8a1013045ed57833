"""The tenant registry's source of truth, in the model store beside each tenant's models:

    tenants/<tenant>/tenant.json   {"name": ..., "key_sha256": ..., "created": ..., "rotated": ..., "limits": {...}}
    tenants/<tenant>/models/...    (the catalog, catalog/repository.py)

Key hashes and limits only: an API key itself is never stored anywhere. Each record is written whole with
put_bytes (atomic: readers see the old record or the new one). Deleting a tenant removes its record; its
models stay. Redis (router/tenants.py, RedisTenants) is an index of these records, recreated from them by
`mmhost tenant rebuild` and `mmhost catalog rebuild`; routers read them directly while Redis is empty.

This module knows records as plain dicts (router/tenants.py owns their meaning), so the catalog layer does
not depend on the router.
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from storage_adapters.base import ObjectNotFound, Storage, StorageError

if TYPE_CHECKING:
    from ground.settings import S3Settings

RECORD_NAME = "tenant.json"
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class TenantRecordInvalid(StorageError):
    """A tenant record exists but is not JSON or does not name its own location."""


class TenantStore:
    def __init__(self, storage: Storage, read_workers: int = 16) -> None:
        self.storage = storage
        self.read_workers = read_workers

    @classmethod
    def open(cls, uri: str, s3: S3Settings | None = None) -> TenantStore:
        from storage_adapters.factory import open_storage

        return cls(open_storage(uri, s3))

    @property
    def description(self) -> str:
        return self.storage.description

    @staticmethod
    def key(name: str) -> str:
        if not _NAME.match(name) or name in (".", ".."):
            raise ValueError(f"tenant name {name!r} is invalid")
        return f"tenants/{name}/{RECORD_NAME}"

    def get(self, name: str) -> dict | None:
        key = self.key(name)
        try:
            raw = self.storage.read_bytes(key)
        except ObjectNotFound:
            return None
        try:
            rec = json.loads(raw)
        except ValueError as e:
            raise TenantRecordInvalid(f"{self.description}: tenant record {key!r} is not JSON: {e}") from e
        if not isinstance(rec, dict) or rec.get("name") != name or not isinstance(rec.get("key_sha256"), str):
            raise TenantRecordInvalid(f"{self.description}: tenant record {key!r} does not describe tenant {name!r}")
        return rec

    def put(self, name: str, record: dict) -> None:
        self.storage.put_bytes(self.key(name), json.dumps({"name": name, **record}, indent=1).encode())

    def put_all(self, records: dict[str, dict]) -> None:
        """Many records (an import), in parallel."""
        with ThreadPoolExecutor(max(1, min(self.read_workers, len(records)))) as ex:
            list(ex.map(lambda item: self.put(*item), records.items()))

    def delete(self, name: str) -> None:
        self.storage.delete(self.key(name))

    def all(self) -> dict[str, dict]:
        """Every tenant's record (tenants with models but no record, e.g. from before records existed, are
        skipped). An unreadable record raises: a rebuild must never silently drop a tenant."""
        names = [n for n in self.storage.list_dirs("tenants/") if _NAME.match(n)]
        with ThreadPoolExecutor(max(1, min(self.read_workers, len(names)))) as ex:
            recs = list(ex.map(self.get, names))
        return {n: r for n, r in zip(names, recs, strict=True) if r is not None}
