"""The catalog as the router's front door sees it: does this tenant have this model (and version)?
Lookups go to the catalog (Redis index or storage) in a worker thread and are reused for a short TTL, so
steady traffic costs no catalog round trip; concurrent misses for one model share one lookup. When the
catalog cannot be reached, models it knew keep being routed; unknown ones get UNAVAILABLE. The clock
(monotonic seconds) is passed in.

Memory stays bounded whatever names tenants send: a name that cannot be a model or version name
(ground.manifest.NAME_RE: letters, digits, '_', '-', '.', at most 128) is NOT_FOUND at once, never looked up and
never remembered; names the catalog did not know are remembered in an LRU of `max_unknown` entries (for
`miss_ttl_s`), names it knew in another of `max_known`. NOT_FOUND messages echo at most 64 characters of a
name (ground.errors.shown)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable

from ground.errors import NotFound, Unavailable, shown
from ground.manifest import NAME_RE
from ground.wire import Reason
from catalog.index import Catalog, CatalogUnavailable
from storage_adapters.base import StorageError
from catalog.repository import ModelNotFound

log = logging.getLogger(__name__)


def not_found(model: str, version: str = "") -> NotFound:
    """One message for 'missing' and 'another tenant's': they must be indistinguishable."""
    if version:
        return NotFound(f"model {shown(model)} version {shown(version)} not found")
    return NotFound(f"model {shown(model)} not found")


def valid_name(name: str) -> bool:
    """Could this be a model (or version) name at all? (Names are path segments in the store.)"""
    return bool(NAME_RE.match(name)) and name not in (".", "..")


def _unavailable(e: Exception) -> Unavailable:
    # tenant-facing: the catalog's location (a Redis URL, a bucket) is in the log under the request id only
    return Unavailable("catalog unavailable; retry later", retry_after_ms=1000, reason=Reason.CATALOG_DOWN.value,
                       detail=str(e))


class ModelDirectory:
    def __init__(self, catalog: Catalog | None, ttl_s: float, miss_ttl_s: float,
                 clock: Callable[[], float] = time.monotonic, *, max_known: int = 100_000,
                 max_unknown: int = 4096) -> None:
        self.catalog = catalog
        self.clock = clock
        self.ttl_s, self.miss_ttl_s = ttl_s, miss_ttl_s
        self.max_known, self.max_unknown = max_known, max_unknown
        self._known: OrderedDict[tuple[str, str], tuple[float, frozenset[str]]] = OrderedDict()
        self._unknown: OrderedDict[tuple[str, str], float] = OrderedDict()  # key -> when the miss expires
        self._inflight: dict[tuple[str, str], asyncio.Future] = {}

    def cached(self) -> tuple[int, int]:
        """(known, unknown) names remembered."""
        return len(self._known), len(self._unknown)

    @property
    def enabled(self) -> bool:
        return self.catalog is not None

    async def check(self, tenant: str, model: str, version: str = "") -> None:
        """NotFound unless the tenant has the model (and the version, when one is named)."""
        if self.catalog is None:
            return  # no catalog configured: the host answers NOT_FOUND within the tenant
        if not valid_name(model) or (version and not valid_name(version)):
            raise not_found(model, version)
        versions = await self.versions(tenant, model)
        if not versions or (version and version not in versions):
            raise not_found(model, version)

    async def versions(self, tenant: str, model: str) -> frozenset[str]:
        k = (tenant, model)
        if not valid_name(model):
            return frozenset()
        now = self.clock()
        hit = self._known.get(k)
        if hit is not None and hit[0] > now:
            self._known.move_to_end(k)
            return hit[1]
        miss = self._unknown.get(k)
        if miss is not None and miss > now:
            return frozenset()
        fut = self._inflight.get(k)
        if fut is None:
            fut = self._inflight[k] = asyncio.get_running_loop().create_task(self._lookup(tenant, model))
            fut.add_done_callback(lambda f: (self._inflight.pop(k, None), f.cancelled() or f.exception()))
        if hit is not None and hit[1]:
            # expired but known: served from memory while the lookup refreshes it in the background, so a
            # paused or slow Redis never holds a request for a known model (it waited the socket timeout)
            return hit[1]
        return await asyncio.shield(fut)

    async def _lookup(self, tenant: str, model: str) -> frozenset[str]:
        assert self.catalog is not None
        try:
            vs = frozenset(await asyncio.to_thread(self.catalog.versions, tenant, model))
        except ModelNotFound:
            vs = frozenset()
        except (CatalogUnavailable, StorageError) as e:
            stale = self._known.get((tenant, model))
            if stale is not None and stale[1]:  # Redis or storage down: keep routing what we knew
                log.warning("catalog lookup of %s/%s failed, using what was known: %s", tenant, model, e)
                self._remember((tenant, model), stale[1])
                return stale[1]
            raise _unavailable(e) from e
        self._remember((tenant, model), vs)
        return vs

    def _remember(self, k: tuple[str, str], vs: frozenset[str]) -> None:
        now = self.clock()
        if vs:
            self._unknown.pop(k, None)
            self._known[k] = (now + self.ttl_s, vs)
            self._known.move_to_end(k)
            while len(self._known) > self.max_known:
                self._known.popitem(last=False)
        else:
            self._known.pop(k, None)
            if self.max_unknown <= 0:
                self._unknown.pop(k, None)
                return
            self._unknown[k] = now + self.miss_ttl_s
            self._unknown.move_to_end(k)
            while len(self._unknown) > self.max_unknown:
                self._unknown.popitem(last=False)

    def forget(self, tenant: str, model: str) -> None:
        """Drop what is remembered of one model (a version was just published through this router): the next
        request looks it up again instead of reusing a miss for up to miss_ttl_s."""
        self._known.pop((tenant, model), None)
        self._unknown.pop((tenant, model), None)

    async def listing(self, tenant: str) -> list[tuple[str, list[str]]]:
        """(model, versions) for every model of the tenant (RepositoryIndex; not cached)."""
        catalog = self.catalog
        assert catalog is not None
        try:
            return await asyncio.to_thread(lambda: [(m, vs) for _, m, vs, _ in catalog.entries(tenant)])
        except (CatalogUnavailable, StorageError) as e:
            raise _unavailable(e) from e
