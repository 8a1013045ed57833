"""A host's residency: each version's lifecycle and the device cache change together."""

from __future__ import annotations

from hostd.core.device import DeviceCache
from hostd.core.lifecycle import Action, ModelState
from hostd.core.residency import Residency


def test_a_load_that_finds_no_room_is_absent_and_counted_nowhere():
    res = Residency(DeviceCache(100))
    assert res.want("a", 0.0) is Action.START_LOAD
    assert res.reserve("a", "t", 80, 0.0).ok
    res.loaded("a", 80, 0.1, 1.0)
    res.pin("a", True)
    assert res.want("b", 2.0) is Action.START_LOAD
    assert not res.reserve("b", "t", 50, 2.0).ok
    assert res.life("b").state is ModelState.ABSENT and "b" not in res.cache and res.cache.used == 80
    assert res.want("b", 2.0) is Action.START_LOAD  # no backoff


def test_serving_counts_as_a_use_and_unloading_is_busy_until_gone():
    res = Residency(DeviceCache(100))
    res.want("a", 0.0)
    res.reserve("a", "t", 40, 0.0)
    assert res.cache.residents["a"].busy  # loading
    res.loaded("a", 40, 0.1, 1.0)
    assert res.want("a", 5.0) is Action.SERVE and res.cache.residents["a"].last_use == 5.0
    assert res.begin_unload("a") and res.cache.residents["a"].busy
    assert res.want("a", 6.0) is Action.WAIT_UNLOAD
    assert res.unloaded("a").size == 40 and res.cache.used == 0 and res.life("a").state is ModelState.ABSENT


def test_a_failed_load_frees_its_reservation_and_backs_off():
    res = Residency(DeviceCache(100), backoff_base_s=2.0)
    res.want("a", 0.0)
    res.reserve("a", "t", 40, 0.0)
    assert res.failed("a", "boom", 10.0) == 12.0
    assert res.cache.used == 0 and res.want("a", 11.0) is Action.BACKOFF
    assert res.want("a", 12.0) is Action.START_LOAD
