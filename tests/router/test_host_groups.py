"""Host groups (router/host_groups.py): the pure rules, then the dispatcher and the fast lane's route table
placing by them, against fake hosts and a fake clock."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import ValidationError

from ground.errors import Unavailable
from ground.settings import RouterSettings
from router.cluster import model_key
from router.fastlane_config import route_table
from router.host_groups import SHARED, group_of, group_of_key, hosts_per_group, in_group
from router.placement_policy import PlacementConfig
from tests.router.fakes import FakeClock, FakeHosts, cluster_of, infer, status
from tests.router.test_dispatcher import dispatcher, forward

GROUPS = {"noisy": "bulk", "acme/big": "bulk", "noisy/quiet": ""}


def test_a_models_entry_wins_over_its_tenants_and_the_rest_is_shared():
    assert group_of(GROUPS, "noisy", "anything") == "bulk"
    assert group_of(GROUPS, "noisy", "quiet") == SHARED  # "" names the shared pool, over the tenant's group
    assert group_of(GROUPS, "acme", "big") == "bulk"
    assert group_of(GROUPS, "acme", "small") == SHARED
    assert group_of({}, "acme", "big") == SHARED
    assert group_of_key(GROUPS, model_key("acme", "big", "3")) == "bulk"
    assert group_of_key(GROUPS, model_key("acme", "small")) == SHARED


def test_in_group_keeps_only_the_groups_hosts():
    view = cluster_of(status("a:1"), status("b:1", group="bulk"), status("c:1", group="other"))
    assert [h.address for h in in_group(view.eligible(), "bulk")] == ["b:1"]
    assert [h.address for h in in_group(view.eligible(), SHARED)] == ["a:1"]
    assert in_group(view.eligible(), "none") == []


def test_hosts_per_group_counts_every_named_group_even_when_empty():
    view = cluster_of(status("a:1"), status("b:1", group="bulk"), status("c:1", group="stray"))
    assert hosts_per_group(view.eligible(), GROUPS) == {"": 1, "bulk": 1, "stray": 1}
    assert hosts_per_group(cluster_of(status("a:1")).eligible(), GROUPS) == {"": 1, "bulk": 0}


def test_router_settings_refuse_a_malformed_map():
    assert RouterSettings(host_groups=GROUPS).host_groups == GROUPS
    for bad in ({"a/b/c": "bulk"}, {"a b": "bulk"}, {"acme": "x y"}, {"acme": "x" * 65}):
        with pytest.raises(ValidationError):
            RouterSettings(host_groups=bad)


def _groups_dispatcher(clock, hosts, cluster, placement=None):
    d = dispatcher(clock, hosts, cluster, placement=placement)
    d.groups = dict(GROUPS)
    return d


def test_each_model_is_loaded_and_served_only_in_its_group():
    clock = FakeClock()
    hosts = FakeHosts(clock)
    # the shared host is emptier (rule 3 would prefer it) and already holds the noisy model (an operator's load)
    cluster = cluster_of(status("shared:1", models=(("noisy", "m", "READY"),), free=8 << 30),
                         status("bulk:1", group="bulk", free=1 << 30))
    d = _groups_dispatcher(clock, hosts, cluster)
    assert forward(d, "noisy", "m")[1] == "bulk:1"  # not the READY copy outside its group: a load in it
    assert forward(d, "acme", "big")[1] == "bulk:1"
    assert forward(d, "acme", "small")[1] == "shared:1"
    assert forward(d, "noisy", "quiet")[1] == "shared:1"


def test_a_group_with_no_host_up_is_unavailable_not_served_elsewhere(caplog):
    clock = FakeClock()
    hosts = FakeHosts(clock)
    d = _groups_dispatcher(clock, hosts, cluster_of(status("shared:1")))
    with pytest.raises(Unavailable) as e:
        forward(d, "noisy", "m")
    assert e.value.reason == "no_host" and not hosts.calls
    assert "no host of group 'bulk' is up" in caplog.text
    assert forward(d, "acme", "small")[1] == "shared:1"  # the shared pool is unaffected


def test_a_hot_model_gets_its_extra_copy_inside_its_group():
    clock = FakeClock()
    hosts = FakeHosts(clock)
    cluster = cluster_of(status("bulk:1", group="bulk", models=(("noisy", "m", "READY"),), queue_depth=5),
                         status("shared:1", free=8 << 30), status("bulk:2", group="bulk"))
    d = _groups_dispatcher(clock, hosts, cluster, placement=PlacementConfig(hot_queue_depth=2))

    async def go():
        resp = await d.forward("noisy", "m", "", "ModelInfer", infer("m"))
        await asyncio.gather(*list(d.background))
        return resp

    assert asyncio.run(go())[1] == "bulk:1"
    loads = [c.address for c in hosts.calls if c.method == "RepositoryModelLoad"]
    assert loads == ["bulk:2"]  # never the shared host, though it has more room
    # with no other host in the group, no copy at all
    hosts2 = FakeHosts(clock)
    alone = cluster_of(status("bulk:1", group="bulk", models=(("noisy", "m", "READY"),), queue_depth=5),
                       status("shared:1", free=8 << 30))
    d2 = _groups_dispatcher(clock, hosts2, alone, placement=PlacementConfig(hot_queue_depth=2))
    assert d2.replicate_if_hot("noisy", "m", clock()) is None
    assert not hosts2.calls


def test_the_fast_lane_routes_a_model_only_to_holders_in_its_group():
    a = cluster_of(status("shared:1", models=(("noisy", "m", "READY"), ("acme", "small", "READY"))),
                   status("bulk:1", group="bulk", models=(("noisy", "m", "READY"), ("acme", "small", "READY"))))
    names = {"shared:1": "h0", "bulk:1": "h1"}
    routes = route_table(a.eligible(), frozenset({"noisy", "acme"}), names, GROUPS)
    assert routes["noisy/m/"] == "h1" and routes["noisy/m/1"] == "h1"
    assert routes["acme/small/"] == "h0" and routes["acme/small/1"] == "h0"
    # no groups: every holder is a candidate, as before
    assert set(route_table(a.eligible(), frozenset({"noisy", "acme"}), names)) == set(routes)
