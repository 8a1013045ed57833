"""Router.refresh_hosts reads the host view once; in Redis mode whether that read worked is
mmhost_router_redis_up, without Redis the gauge is left alone (a failed read raises either way)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from router.cluster import ClusterView
from router.local_load import LocalLoad
from router.metrics import RouterMetrics
from router.server import Router
from tests.router.fakes import status


class _Forwarder:
    ports: dict[str, int] | None = None

    def set_data_ports(self, ports: dict[str, int]) -> None:
        self.ports = ports

    async def rotate(self) -> None:
        pass

    async def forget(self, keep) -> None:
        pass

    def sweep(self) -> int:
        return 0


class _Source:
    def __init__(self) -> None:
        self.fail = False
        self.reads = 0
        self.complete = True

    async def read(self):
        self.reads += 1
        if self.fail:
            raise ConnectionError("redis down")
        return {}


def _router(redis: bool, groups: dict[str, str] | None = None, **settings) -> tuple[Router, _Source]:
    r = Router.__new__(Router)  # only what refresh_hosts reads
    src = _Source()
    r.dispatcher = SimpleNamespace(groups=groups or {})
    r.forwarder, r.source, r.metrics = _Forwarder(), src, RouterMetrics()
    r._aredis = object() if redis else None
    r.cluster, r.local, r.clock = ClusterView(2.0), LocalLoad(), lambda: 0.0
    r.settings = SimpleNamespace(**{"pending_ttl_s": 30.0, "hostd_data_link": True, "hostd_ca": None, **settings})
    return r, src


def test_redis_up_follows_each_read_in_redis_mode():
    r, src = _router(redis=True)
    asyncio.run(r.refresh_hosts())
    assert r.metrics.redis_up._value.get() == 1
    src.fail = True
    with pytest.raises(ConnectionError):
        asyncio.run(r.refresh_hosts())
    assert r.metrics.redis_up._value.get() == 0 and src.reads == 2
    src.fail = False
    asyncio.run(r.refresh_hosts())
    assert r.metrics.redis_up._value.get() == 1 and src.reads == 3


def test_without_redis_the_gauge_is_left_alone():
    r, src = _router(redis=False)
    r.metrics.redis_up.set(7)  # a sentinel: never written without Redis
    asyncio.run(r.refresh_hosts())
    src.fail = True
    with pytest.raises(ConnectionError):
        asyncio.run(r.refresh_hosts())
    assert r.metrics.redis_up._value.get() == 7 and src.reads == 2


def test_with_host_groups_each_group_gauge_counts_its_hosts_up():
    r, src = _router(redis=False, groups={"acme": "bulk", "beta": "gpu-b"})
    hosts = {a: status(a, sent=0.0, group=g) for a, g in (("h1:1", "bulk"), ("h2:1", "bulk"), ("h3:1", ""))}

    async def read():
        return hosts

    src.read = read  # type: ignore[method-assign]
    asyncio.run(r.refresh_hosts())
    up = {s.labels["group"]: s.value for m in r.metrics.group_hosts_up.collect() for s in m.samples}
    assert up == {"bulk": 2, "gpu-b": 0, "": 1}


@pytest.mark.parametrize(("settings", "want"), [
    ({}, {"h1:1": 9001}),  # h2 advertises none (an older hostd, or one with TLS on Python 3.10)
    ({"hostd_data_link": False}, None),
    ({"hostd_ca": "ca.pem"}, {"h1:1": 9001}),  # TLS to hostds: the links go with the same mutual TLS
])
def test_the_hosts_data_ports_go_to_the_forwarder_unless_links_are_off(settings, want):
    r, src = _router(redis=False, **settings)
    h1, h2 = status("h1:1", sent=0.0), status("h2:1", sent=0.0)
    h1.data_port = 9001

    async def read():
        return {"h1:1": h1, "h2:1": h2}

    src.read = read  # type: ignore[method-assign]
    asyncio.run(r.refresh_hosts())
    assert r.forwarder.ports == want
