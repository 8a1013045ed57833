"""hostd's view of the catalog: a model's versions and version policy, read from storage and reused for a
short time, so that a request costs no storage round trip. When storage is down, the last known versions
keep being served."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from ground.errors import Unavailable
from ground.manifest import ModelManifest, VersionPolicy
from storage_adapters.base import StorageError
from catalog.repository import ModelRepository

log = logging.getLogger(__name__)


@dataclass
class CatalogItem:
    expires: float
    versions: list[str]
    policy: VersionPolicy


def _storage_down(what: str, e: StorageError) -> Unavailable:
    return Unavailable(f"{what}: storage unavailable: {e}", reason="storage_down", retry_after_ms=1000)


class CatalogView:
    def __init__(self, repo: ModelRepository, ttl_s: float = 2.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.repo = repo
        self._ttl = ttl_s
        self._clock = clock
        self._items: dict[tuple[str, str], CatalogItem] = {}

    async def item(self, tenant: str, model: str) -> CatalogItem:
        now = self._clock()
        item = self._items.get((tenant, model))
        if item is not None and item.expires > now:
            return item
        try:
            versions, policy = await asyncio.to_thread(self.repo.versions_and_policy, tenant, model)
        except StorageError as e:
            if item is not None:  # storage down: keep serving what we know
                log.warning("catalog refresh for %s/%s failed, using the last known versions: %s", tenant, model, e)
                item.expires = now + self._ttl
                return item
            raise _storage_down(f"model {model!r}", e) from e
        item = CatalogItem(now + self._ttl, versions, policy)
        self._items[(tenant, model)] = item
        return item

    async def manifest(self, tenant: str, model: str, version: str) -> ModelManifest:
        """Raises ModelNotFound, or Unavailable when storage is down."""
        try:
            return await asyncio.to_thread(self.repo.manifest, tenant, model, version)
        except StorageError as e:
            raise _storage_down(f"model {model!r}", e) from e

    async def models(self, tenant: str) -> list[tuple[str, list[str]]]:
        """Every model of a tenant with its complete versions (RepositoryIndex)."""
        def read() -> list[tuple[str, list[str]]]:
            return [(mname, self.repo.versions(tenant, mname)) for mname in self.repo.models(tenant)]

        try:
            return await asyncio.to_thread(read)
        except StorageError as e:
            raise _storage_down("repository index", e) from e
