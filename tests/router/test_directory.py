"""The router's front-door catalog check (router/directory.py) with a fake catalog and a fake clock: lookups
reused for their TTL, misses for a shorter one, concurrent misses sharing one lookup, and what is served
while the catalog is down."""

from __future__ import annotations

import asyncio
import threading

import pytest

from catalog.index import CatalogUnavailable
from catalog.repository import ModelNotFound
from ground.errors import NotFound, Unavailable
from router.directory import ModelDirectory
from tests.router.fakes import FakeClock


class FakeCatalog:
    def __init__(self, models: dict[tuple[str, str], list[str]]) -> None:
        self.models = models
        self.down = False
        self.lookups = 0
        self.gate: threading.Event | None = None  # when set, lookups wait for it (to make them concurrent)

    def versions(self, tenant: str, model: str) -> list[str]:
        self.lookups += 1
        if self.gate is not None:
            self.gate.wait(5)
        if self.down:
            raise CatalogUnavailable("redis://fake: connection refused")
        if (tenant, model) not in self.models:
            raise ModelNotFound(f"{tenant}/{model}")
        return self.models[(tenant, model)]


def directory(catalog: FakeCatalog, clock: FakeClock) -> ModelDirectory:
    return ModelDirectory(catalog, ttl_s=5.0, miss_ttl_s=1.0, clock=clock)  # type: ignore[arg-type]


def check(d: ModelDirectory, tenant: str, model: str, version: str = "") -> None:
    asyncio.run(d.check(tenant, model, version))


def test_a_lookup_is_reused_for_its_ttl_then_repeated():
    clock, cat = FakeClock(), FakeCatalog({("acme", "m"): ["1", "2"]})
    d = directory(cat, clock)
    check(d, "acme", "m")
    check(d, "acme", "m", "2")
    clock.advance(4.9)
    check(d, "acme", "m", "1")
    assert cat.lookups == 1
    clock.advance(0.2)
    check(d, "acme", "m")
    assert cat.lookups == 2


def test_missing_models_versions_and_other_tenants_models_are_not_found_alike():
    clock, cat = FakeClock(), FakeCatalog({("globex", "secret"): ["1"], ("acme", "m"): ["1"]})
    d = directory(cat, clock)
    with pytest.raises(NotFound) as a:
        check(d, "acme", "secret")
    with pytest.raises(NotFound) as b:
        check(d, "acme", "nothing")
    assert a.value.message == "model 'secret' not found" and b.value.message == "model 'nothing' not found"
    with pytest.raises(NotFound):
        check(d, "acme", "m", "9")


def test_a_miss_is_remembered_for_the_shorter_ttl():
    clock, cat = FakeClock(), FakeCatalog({})
    d = directory(cat, clock)
    for _ in range(3):
        with pytest.raises(NotFound):
            check(d, "acme", "new")
    assert cat.lookups == 1
    cat.models[("acme", "new")] = ["1"]  # just uploaded
    clock.advance(1.0)
    check(d, "acme", "new")
    assert cat.lookups == 2


def test_concurrent_misses_share_one_lookup():
    clock, cat = FakeClock(), FakeCatalog({("acme", "m"): ["1"]})
    d = directory(cat, clock)
    cat.gate = threading.Event()

    async def go():
        calls = [asyncio.ensure_future(d.check("acme", "m")) for _ in range(10)]
        await asyncio.sleep(0.05)
        cat.gate.set()
        await asyncio.gather(*calls)

    asyncio.run(go())
    assert cat.lookups == 1


def test_while_the_catalog_is_down_known_models_keep_routing_and_unknown_ones_are_unavailable():
    clock, cat = FakeClock(), FakeCatalog({("acme", "m"): ["1"]})
    d = directory(cat, clock)
    check(d, "acme", "m")
    cat.down = True
    clock.advance(10)
    check(d, "acme", "m")  # served from what was known
    with pytest.raises(Unavailable) as e:
        check(d, "acme", "other")
    assert (e.value.reason, e.value.retry_after_ms) == ("catalog_down", 1000)


def test_without_a_catalog_every_model_passes_to_the_hosts():
    d = ModelDirectory(None, 5.0, 1.0, clock=FakeClock())
    check(d, "acme", "anything")
    assert not d.enabled


def test_unknown_names_are_remembered_in_a_bounded_lru_and_impossible_names_never_looked_up():
    clock, cat = FakeClock(), FakeCatalog({("acme", "m"): ["1"]})
    d = ModelDirectory(cat, ttl_s=5.0, miss_ttl_s=1.0, clock=clock, max_unknown=100)  # type: ignore[arg-type]

    async def many() -> int:
        refused = 0
        for i in range(5_000):
            try:
                await d.check("acme", f"nope{i}")
            except NotFound:
                refused += 1
        return refused

    assert asyncio.run(many()) == 5_000
    assert d.cached() == (0, 100) and cat.lookups == 5_000
    check(d, "acme", "m")
    for name in ("x" * 129, "a/b", "..", "", "nul\x00", "é"):
        with pytest.raises(NotFound) as e:
            check(d, "acme", name)
        assert len(e.value.message) < 100
    with pytest.raises(NotFound):
        check(d, "acme", "m", "v" * 500)
    assert d.cached() == (1, 100) and cat.lookups == 5_001  # none of those reached the catalog


def test_not_found_echoes_at_most_64_characters_of_a_name():
    d = directory(FakeCatalog({}), FakeClock())
    with pytest.raises(NotFound) as e:
        check(d, "acme", "n" * 128)
    assert e.value.message == f"model {'n' * 64!r}... not found"


def test_catalog_down_names_no_location_to_the_caller():
    clock, cat = FakeClock(), FakeCatalog({})
    cat.down = True
    d = directory(cat, clock)
    with pytest.raises(Unavailable) as e:
        check(d, "acme", "m")
    assert "redis://" not in e.value.message and "redis://fake" in e.value.detail


def test_an_expired_known_model_is_served_at_once_while_a_hanging_lookup_refreshes_it():
    """Redis paused: the lookup hangs up to the socket timeout; requests for a known model must not wait on it."""
    clock, cat = FakeClock(), FakeCatalog({("acme", "m"): ["1"]})
    d = directory(cat, clock)

    async def run() -> None:
        await d.check("acme", "m")
        cat.gate = threading.Event()
        cat.models[("acme", "m")] = ["1", "2"]
        clock.advance(6)
        for _ in range(5):  # each answered from memory while the one refresh hangs
            await asyncio.wait_for(d.check("acme", "m", "1"), 0.5)
        cat.gate.set()
        for _ in range(100):
            if not d._inflight:
                break
            await asyncio.sleep(0.01)
        await d.check("acme", "m", "2")  # the refresh landed
        assert cat.lookups == 2

    asyncio.run(run())
