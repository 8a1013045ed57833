"""The cache tiers' bookkeeping and the memory probe selection, without a server."""

from __future__ import annotations

import logging


from hostd.cache.device import DeviceCache
from hostd.cache.policy import Share
from hostd.cache.tiers import DiskTier, RamTier
from hostd.memory import CpuProbe, select_probe


def test_ram_tier_is_lru_within_its_budget():
    ram = RamTier(100)
    ram.put("a", {"f": b"x" * 40})
    ram.put("b", {"f": b"x" * 40})
    assert ram.get("a") is not None  # a is now the most recent
    assert ram.put("c", {"f": b"x" * 40}) == ["b"]
    assert ram.used == 80 and ram.get("b") is None
    assert ram.put("huge", {"f": b"x" * 101}) == [] and "huge" not in ram  # larger than the budget: not kept
    assert (ram.hits, ram.misses) == (1, 1)


def test_disk_tier_evicts_lru_versions_but_never_held_ones(tmp_path):
    disk = DiskTier(tmp_path, budget=100)
    for k in ("a", "b"):
        d = disk.path(("t", k, "1"))
        d.mkdir(parents=True)
        (d / "model.onnx").write_bytes(b"x" * 40)
        disk.added(("t", k, "1"), 40)
    disk.hold(("t", "a", "1"))
    assert disk.make_room(40) == [("t", "b", "1")]
    assert not disk.path(("t", "b", "1")).exists() and disk.path(("t", "a", "1")).exists()
    disk.release(("t", "a", "1"))
    assert DiskTier(tmp_path, budget=100).lookup(("t", "a", "1"))  # adopted after a restart


def test_device_cache_reserves_evicts_and_refuses():
    c = DeviceCache(budget=100, high=0.9, low=0.5)
    assert c.reserve("a", "t", 40, now=0).ok
    c.loaded("a", 40, 0.1, now=0)
    assert c.reserve("b", "t", 40, now=1).ok
    c.loaded("b", 40, 0.1, now=1)
    plan = c.reserve("c", "t", 40, now=2)  # 120 > 90: free down to 50, least recently used first
    assert plan.ok and plan.evict == ("a", "b")
    c.set_busy("a", True)
    c.set_busy("b", True)
    c.release("c")
    assert not c.reserve("c", "t", 40, now=3).ok  # everything else is busy
    assert not c.reserve("z", "t", 101, now=3).ok  # larger than the device


def test_device_cache_shares_protect_a_tenant():
    c = DeviceCache(budget=100, high=1.0, low=1.0, shares={"small": Share(guaranteed=50)})
    for key, tenant, now in (("s", "small", 0), ("b1", "big", 1)):
        assert c.reserve(key, tenant, 40, now).ok
        c.loaded(key, 40, 0.1, now)
    plan = c.reserve("b2", "big", 40, now=2)
    assert plan.ok and plan.evict == ("b1",)  # not "s", though it is older


def test_without_nvml_the_cpu_probe_is_selected_with_one_log_line(caplog):
    caplog.set_level(logging.WARNING, logger="hostd.memory")
    probe = select_probe("cuda")  # no GPU and no NVML library on this machine
    assert isinstance(probe, CpuProbe)
    assert len([r for r in caplog.records if "CPU memory probe" in r.getMessage()]) == 1
    assert probe.used() > 0 and probe.total() > probe.used()
