"""The catalog as the router's front door sees it: does this tenant have this model (and version)?
Lookups go to the catalog (Redis index or storage) in a worker thread and are reused for a short TTL, so
steady traffic costs no catalog round trip; concurrent misses for one model share one lookup. When the
catalog cannot be reached, models it knew keep being routed; unknown ones get UNAVAILABLE. The clock
(monotonic seconds) is passed in."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from ground.errors import NotFound, Unavailable
from ground.wire import Reason
from catalog.index import Catalog, CatalogUnavailable
from storage_adapters.base import StorageError
from catalog.repository import ModelNotFound

log = logging.getLogger(__name__)


def not_found(model: str, version: str = "") -> NotFound:
    """One message for 'missing' and 'another tenant's': they must be indistinguishable."""
    if version:
        return NotFound(f"model {model!r} version {version!r} not found")
    return NotFound(f"model {model!r} not found")


class ModelDirectory:
    def __init__(self, catalog: Catalog | None, ttl_s: float, miss_ttl_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.catalog = catalog
        self.clock = clock
        self.ttl_s, self.miss_ttl_s = ttl_s, miss_ttl_s
        self._cache: dict[tuple[str, str], tuple[float, frozenset[str]]] = {}
        self._inflight: dict[tuple[str, str], asyncio.Future] = {}

    @property
    def enabled(self) -> bool:
        return self.catalog is not None

    async def check(self, tenant: str, model: str, version: str = "") -> None:
        """NotFound unless the tenant has the model (and the version, when one is named)."""
        if self.catalog is None:
            return  # no catalog configured: the host answers NOT_FOUND within the tenant
        versions = await self.versions(tenant, model)
        if not versions or (version and version not in versions):
            raise not_found(model, version)

    async def versions(self, tenant: str, model: str) -> frozenset[str]:
        k = (tenant, model)
        hit = self._cache.get(k)
        now = self.clock()
        if hit is not None and hit[0] > now:
            return hit[1]
        fut = self._inflight.get(k)
        if fut is None:
            fut = self._inflight[k] = asyncio.get_running_loop().create_task(self._lookup(tenant, model))
            fut.add_done_callback(lambda _: self._inflight.pop(k, None))
        return await asyncio.shield(fut)

    async def _lookup(self, tenant: str, model: str) -> frozenset[str]:
        assert self.catalog is not None
        try:
            vs = frozenset(await asyncio.to_thread(self.catalog.versions, tenant, model))
        except ModelNotFound:
            vs = frozenset()
        except (CatalogUnavailable, StorageError) as e:
            stale = self._cache.get((tenant, model))
            if stale is not None and stale[1]:  # Redis or storage down: keep routing what we knew
                log.warning("catalog lookup of %s/%s failed, using what was known: %s", tenant, model, e)
                self._cache[(tenant, model)] = (self.clock() + self.ttl_s, stale[1])
                return stale[1]
            raise Unavailable(f"catalog unavailable: {e}", retry_after_ms=1000, reason=Reason.CATALOG_DOWN.value) from e
        if len(self._cache) > 100_000:
            self._cache.clear()
        self._cache[(tenant, model)] = (self.clock() + (self.ttl_s if vs else self.miss_ttl_s), vs)
        return vs

    async def listing(self, tenant: str) -> list[tuple[str, list[str]]]:
        """(model, versions) for every model of the tenant (RepositoryIndex; not cached)."""
        catalog = self.catalog
        assert catalog is not None
        try:
            return await asyncio.to_thread(lambda: [(m, vs) for _, m, vs, _ in catalog.entries(tenant)])
        except (CatalogUnavailable, StorageError) as e:
            raise Unavailable(f"catalog unavailable: {e}", retry_after_ms=1000, reason=Reason.CATALOG_DOWN.value) from e
