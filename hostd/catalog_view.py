"""hostd's view of the catalog: each model's versions and version policy, read from storage and kept, so
that a request for a known model never waits on storage.

- A model seen before is answered from memory at once; once its entry is older than the TTL, one
  background refresh per model (single-flight) re-reads it. Storage down, slow or hanging: the last known
  versions keep being served, and the failed refresh is logged once per model until one succeeds.
- A model never seen before waits for its first listing, bounded by `lookup_timeout_s`: storage that hangs
  answers UNAVAILABLE `storage_down` in that time, never after the caller's whole deadline.
- An empty listing never takes away a model that is resident on this host (`is_resident`): a restarted,
  empty or half-restored bucket does not turn loaded models into NOT_FOUND. A model that is not resident
  follows storage.
- Names that cannot exist (not a valid name) are NOT_FOUND without a storage call and cost no memory;
  valid unknown names are remembered in a bounded LRU (`max_unknown`), known ones in another (`max_known`).
- Storage calls run on a small pool of their own, so hung storage calls cannot starve other thread work.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from catalog.repository import ModelRepository
from ground.errors import Unavailable
from ground.manifest import NAME_RE, ModelManifest, VersionPolicy
from storage_adapters.base import StorageError

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class CatalogItem:
    fetched: float
    versions: list[str]
    policy: VersionPolicy


def _storage_down(what: str) -> Unavailable:
    # tenant-facing: names no endpoint, bucket or path (those are in the log)
    return Unavailable(f"{what}: model storage is unavailable; retry later", reason="storage_down",
                       retry_after_ms=1000)


def valid_name(name: str) -> bool:
    return bool(NAME_RE.match(name)) and name not in (".", "..")


class CatalogView:
    def __init__(self, repo: ModelRepository, ttl_s: float = 2.0, clock: Callable[[], float] = time.monotonic, *,
                 lookup_timeout_s: float = 3.0, max_known: int = 100_000, max_unknown: int = 4096,
                 is_resident: Callable[[str, str], bool] = lambda tenant, model: False, threads: int = 4,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.repo = repo
        self._ttl = ttl_s
        self._clock = clock
        self._sleep = sleep
        self._timeout = lookup_timeout_s
        self._max_known, self._max_unknown = max_known, max_unknown
        self._is_resident = is_resident
        self._known: OrderedDict[tuple[str, str], CatalogItem] = OrderedDict()
        self._unknown: OrderedDict[tuple[str, str], float] = OrderedDict()  # key -> when it was listed empty
        self._inflight: dict[tuple[str, str], asyncio.Task[CatalogItem]] = {}
        self._rechecks: dict[tuple[str, str], asyncio.Task[tuple[float, CatalogItem]]] = {}
        self._failing: set[tuple[str, str]] = set()
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="catalog")

    # ---- models -------------------------------------------------------------------------------------
    async def item(self, tenant: str, model: str) -> CatalogItem:
        key = (tenant, model)
        now = self._clock()
        known = self._known.get(key)
        if known is not None:
            self._known.move_to_end(key)
            if now - known.fetched >= self._ttl:
                self._refresh(key)  # in the background: this request is served from memory
            return known
        if not (valid_name(tenant) and valid_name(model)):
            return CatalogItem(now, [], VersionPolicy())
        listed_empty = self._unknown.get(key)
        if listed_empty is not None and now - listed_empty < self._ttl:
            return CatalogItem(listed_empty, [], VersionPolicy())
        task = self._refresh(key)
        try:
            return await asyncio.wait_for(asyncio.shield(task), self._timeout)
        except (asyncio.TimeoutError, StorageError):
            raise _storage_down(f"model {model!r}") from None

    async def recheck(self, tenant: str, model: str, min_age_s: float = 0.5) -> CatalogItem:
        """The item listed again, for a version the cached listing lacks: a version published a moment ago is
        callable by its number at once, not a TTL later. The listing a caller gets started after it asked (a
        listing already under way may predate the upload). Listings of one model are at least `min_age_s`
        apart: a recheck of a younger listing waits out the rest of that interval, and every recheck of the
        model in the meantime shares the one listing that follows, so asking for versions that do not exist
        costs storage at most one listing per model every `min_age_s`. Storage down or slower than the lookup
        timeout: the cached item."""
        key = (tenant, model)
        known = self._known.get(key)
        if known is None:
            return await self.item(tenant, model)
        asked = self._clock()

        async def fresh() -> CatalogItem:
            while True:
                task = self._rechecks.get(key)
                if task is None:
                    task = asyncio.get_running_loop().create_task(self._relist(key, min_age_s))
                    self._rechecks[key] = task
                    task.add_done_callback(lambda t: (self._rechecks.pop(key, None) if self._rechecks.get(key) is t
                                                      else None, t.cancelled() or t.exception()))
                started, item = await asyncio.shield(task)
                if started >= asked:
                    return item
                if self._rechecks.get(key) is task:  # done, not yet popped by its callback
                    self._rechecks.pop(key)

        try:
            return await asyncio.wait_for(fresh(), self._timeout)
        except (asyncio.TimeoutError, StorageError):
            return self._known.get(key, known)

    async def _relist(self, key: tuple[str, str], min_age_s: float) -> tuple[float, CatalogItem]:
        """(when the listing started, the item): after any listing under way, and `min_age_s` after the last."""
        await self._settled(key)
        last = self._known.get(key)
        if last is not None:
            wait = last.fetched + min_age_s - self._clock()
            if wait > 0:
                await self._sleep(wait)
        await self._settled(key)
        started = self._clock()
        return started, await self._refresh(key)  # nothing under way: a listing that starts now

    async def _settled(self, key: tuple[str, str]) -> None:
        """Once no listing of `key` is under way."""
        while (inflight := self._inflight.get(key)) is not None:
            await asyncio.wait([inflight])
            if self._inflight.get(key) is inflight:
                self._inflight.pop(key)

    def _refresh(self, key: tuple[str, str]) -> asyncio.Task[CatalogItem]:
        task = self._inflight.get(key)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._fetch(key))
            self._inflight[key] = task
            task.add_done_callback(lambda t: (self._inflight.pop(key, None), t.cancelled() or t.exception()))
        return task

    async def _fetch(self, key: tuple[str, str]) -> CatalogItem:
        tenant, model = key
        old = self._known.get(key)
        try:
            versions, policy = await self._run(self.repo.versions_and_policy, tenant, model)
        except StorageError as e:
            if key not in self._failing:
                self._failing.add(key)
                log.warning("catalog refresh for %s/%s failed%s: %s", tenant, model,
                            ", serving the last known versions" if old else "", e)
            if old is not None:
                old.fetched = self._clock()  # try again after another TTL
                return old
            raise
        self._failing.discard(key)
        now = self._clock()
        if not versions and old is not None and old.versions and self._is_resident(tenant, model):
            log.warning("storage lists no versions of %s/%s, which is resident here: keeping %s", tenant, model,
                        old.versions)
            old.fetched = now
            return old
        item = CatalogItem(now, versions, policy)
        if versions:
            self._unknown.pop(key, None)
            self._known[key] = item
            self._known.move_to_end(key)
            while len(self._known) > self._max_known:
                self._known.popitem(last=False)
        else:
            self._known.pop(key, None)
            self._unknown[key] = now
            self._unknown.move_to_end(key)
            while len(self._unknown) > self._max_unknown:
                self._unknown.popitem(last=False)
        return item

    async def _run(self, fn: Callable[..., T], *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def _bounded(self, what: str, call: Awaitable[T]) -> T:
        try:
            return await asyncio.wait_for(call, self._timeout)
        except asyncio.TimeoutError:
            log.warning("%s: storage did not answer within %.1fs", what, self._timeout)
            raise _storage_down(what) from None
        except StorageError as e:
            log.warning("%s: storage error: %s", what, e)
            raise _storage_down(what) from e

    # ---- manifests and listings ----------------------------------------------------------------------
    async def manifest(self, tenant: str, model: str, version: str) -> ModelManifest:
        """Raises ModelNotFound, or Unavailable (storage_down) when storage fails or does not answer in time."""
        return await self._bounded(f"model {model!r}", self._run(self.repo.manifest, tenant, model, version))

    async def models(self, tenant: str) -> list[tuple[str, list[str]]]:
        """Every model of a tenant with its complete versions (RepositoryIndex)."""
        def read() -> list[tuple[str, list[str]]]:
            return [(mname, self.repo.versions(tenant, mname)) for mname in self.repo.models(tenant)]

        return await self._bounded("repository index", self._run(read))

    @property
    def sizes(self) -> tuple[int, int]:
        """(known, unknown) entries held: both bounded."""
        return len(self._known), len(self._unknown)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
