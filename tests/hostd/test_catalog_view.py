"""hostd's catalog view keeps storage off the request path: known models are answered from memory while
storage hangs or fails, a first lookup is bounded in time, an empty listing never takes away a resident
model, and unknown names cost bounded memory. Real asyncio and a real local store; the repository wrapper
only adds a hang (a threading.Event) or a failure, as a stalled or refusing S3 would."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from catalog.repository import ModelRepository
from ground.errors import Unavailable
from hostd.catalog_view import CatalogView
from storage_adapters.base import StorageUnavailable
from storage_adapters.local import LocalStorage


class FlakyRepo(ModelRepository):
    def __init__(self, storage) -> None:
        super().__init__(storage)
        self.release = threading.Event()
        self.release.set()
        self.fail = False
        self.calls = 0

    def versions_and_policy(self, tenant, model):
        self.calls += 1
        self.release.wait(10)
        if self.fail:
            raise StorageUnavailable("s3://bucket at http://10.0.0.1:9000: connection refused")
        return super().versions_and_policy(tenant, model)


@pytest.fixture
def repo(tmp_path) -> FlakyRepo:
    s = LocalStorage(tmp_path)
    s.put_bytes("tenants/acme/models/m/1/manifest.json", b"{}")
    return FlakyRepo(s)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_known_models_never_wait_on_hanging_storage(repo):
    async def run() -> None:
        clock = Clock()
        view = CatalogView(repo, ttl_s=2.0, clock=clock, lookup_timeout_s=0.5)
        assert (await view.item("acme", "m")).versions == ["1"]
        repo.release.clear()  # storage hangs from now on
        clock.now = 10.0  # far past the TTL
        t0 = time.monotonic()
        for _ in range(50):
            assert (await view.item("acme", "m")).versions == ["1"]
        assert time.monotonic() - t0 < 0.2, "served from memory, not after a storage timeout"
        await asyncio.sleep(0.05)  # the refresh task gets to run (and hangs in storage)
        assert repo.calls == 2, "one background refresh for all 50 requests (single-flight)"
        # a model never seen before waits at most the lookup timeout, then UNAVAILABLE storage_down
        t0 = time.monotonic()
        with pytest.raises(Unavailable) as e:
            await view.item("acme", "other")
        assert time.monotonic() - t0 < 2.0
        assert e.value.reason == "storage_down"
        assert "10.0.0.1" not in e.value.message and "bucket" not in e.value.message
        repo.release.set()
        view.close()

    asyncio.run(run())


def test_failing_storage_serves_the_last_known_versions(repo):
    async def run() -> None:
        clock = Clock()
        view = CatalogView(repo, ttl_s=1.0, clock=clock)
        await view.item("acme", "m")
        repo.fail = True
        for step in range(5):
            clock.now = 2.0 * (step + 1)
            assert (await view.item("acme", "m")).versions == ["1"]
            await asyncio.sleep(0.02)  # let the background refresh fail
        view.close()

    asyncio.run(run())


@pytest.mark.parametrize("resident", [True, False])
def test_an_empty_listing_never_takes_away_a_resident_model(repo, resident):
    async def run() -> None:
        clock = Clock()
        view = CatalogView(repo, ttl_s=1.0, clock=clock, is_resident=lambda t, m: resident)
        await view.item("acme", "m")
        repo.storage.delete("tenants/acme/models/m")  # a restarted, empty bucket
        clock.now = 5.0
        await view.item("acme", "m")  # starts the refresh
        for _ in range(50):
            await asyncio.sleep(0.01)
            if not view._inflight:
                break
        clock.now = 5.5
        versions = (await view.item("acme", "m")).versions
        assert versions == (["1"] if resident else [])
        view.close()

    asyncio.run(run())


def test_unknown_names_cost_bounded_memory(repo):
    async def run() -> None:
        view = CatalogView(repo, max_unknown=100)
        for i in range(500):
            assert (await view.item("acme", f"nope{i}")).versions == []
        calls = repo.calls
        for bad in ("a\0b", "x" * 300, "..", "a/b"):
            assert (await view.item("acme", bad)).versions == []
        assert repo.calls == calls, "names that cannot exist never reach storage"
        assert view.sizes == (0, 100)
        view.close()

    asyncio.run(run())


class Sleeper:
    """asyncio.sleep on the virtual clock: advances it instead of waiting."""
    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.slept: list[float] = []

    async def __call__(self, s: float) -> None:
        self.slept.append(s)
        self.clock.now += s
        await asyncio.sleep(0)


def test_a_version_published_since_the_listing_is_found_by_recheck_at_most_once_per_interval(repo, tmp_path):
    """A version the cached listing lacks is listed again at once (a tenant's upload is callable by its number
    straight away, even when the cached listing is only a moment old), but asking for versions that do not
    exist lists at most once per min_age_s."""
    async def run() -> None:
        clock = Clock()
        sleep = Sleeper(clock)
        view = CatalogView(repo, ttl_s=60.0, clock=clock, sleep=sleep)
        assert (await view.item("acme", "m")).versions == ["1"]
        LocalStorage(tmp_path).put_bytes("tenants/acme/models/m/2/manifest.json", b"{}")
        clock.now = 0.1
        assert (await view.item("acme", "m")).versions == ["1"]  # the cached listing, within its TTL
        # the listing is 0.1 s old: the recheck waits out the interval, then lists (was: the old listing, NOT_FOUND)
        assert (await view.recheck("acme", "m", min_age_s=0.5)).versions == ["1", "2"]
        assert sleep.slept == [pytest.approx(0.4)]
        calls = repo.calls
        # twenty rechecks at once for versions nobody published: one listing, min_age_s after the last
        items = await asyncio.gather(*(view.recheck("acme", "m", min_age_s=0.5) for _ in range(20)))
        assert repo.calls == calls + 1
        assert all(i.versions == ["1", "2"] for i in items)
        assert sleep.slept[1:] == [pytest.approx(0.5)]
        # one after another: listings stay min_age_s apart on the clock
        t0 = clock.now
        for _ in range(4):
            await view.recheck("acme", "m", min_age_s=0.5)
        assert repo.calls == calls + 5
        assert clock.now - t0 == pytest.approx(2.0)
        repo.fail = True  # storage down: the cached listing
        clock.now += 3.0
        assert (await view.recheck("acme", "m")).versions == ["1", "2"]
        view.close()

    asyncio.run(run())


def test_a_recheck_never_takes_a_listing_that_started_before_it_asked(repo, tmp_path):
    """A background refresh under way when the version was published may not list it: the recheck waits for
    it and lists again."""
    async def run() -> None:
        clock = Clock()
        view = CatalogView(repo, ttl_s=1.0, clock=clock, sleep=Sleeper(clock))
        assert (await view.item("acme", "m")).versions == ["1"]
        clock.now = 5.0
        repo.release.clear()  # the TTL refresh below hangs in storage, having started before the upload
        await view.item("acme", "m")
        await asyncio.sleep(0.05)
        calls = repo.calls
        LocalStorage(tmp_path).put_bytes("tenants/acme/models/m/2/manifest.json", b"{}")
        clock.now = 5.1
        recheck = asyncio.ensure_future(view.recheck("acme", "m", min_age_s=0.5))
        await asyncio.sleep(0.05)
        repo.release.set()
        assert (await recheck).versions == ["1", "2"]
        assert repo.calls == calls + 1
        view.close()

    asyncio.run(run())
