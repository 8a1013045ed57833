"""The dispatcher (router/dispatcher.py) against fake hosts and a fake clock: failover, what marks a host
down and what does not, the retry budget, the deadline, the attempt limit, copies of hot models. No
processes, no gRPC server, no sleeping."""

from __future__ import annotations

import asyncio
import random

import pytest

from ground.deadlines import INF
from ground.errors import DeadlineExceeded, Forwarded, Unavailable
from router.cluster import ClusterView, HostState
from router.dispatcher import Dispatcher
from router.failover import RetryBudget
from router.local_load import LocalLoad
from router.metrics import RouterMetrics
from router.placement_policy import PlacementConfig
from tests.router.fakes import C, Call, FakeClock, FakeHosts, cluster_of, infer, ok, refusal, status, transport_error

HOSTS = ("h1:1", "h2:1", "h3:1", "h4:1", "h5:1")


def dispatcher(clock: FakeClock, hosts: FakeHosts, cluster: ClusterView, *, max_attempts: int = 3,
               budget: RetryBudget | None = None, placement: PlacementConfig | None = None) -> Dispatcher:
    return Dispatcher(hosts=hosts, cluster=cluster, local=LocalLoad(), metrics=RouterMetrics(), clock=clock,
                      max_attempts=max_attempts, budget=budget or RetryBudget(0.2, 100),
                      placement=placement or PlacementConfig(hot_queue_depth=0), rng=random.Random(0))


def ready_everywhere(n: int, *models: tuple[str, str]) -> ClusterView:
    return cluster_of(*(status(a, models=tuple((t, m, "READY") for t, m in models)) for a in HOSTS[:n]))


def metric(d: Dispatcher, name: str, **labels: str) -> float:
    return d.metrics.registry.get_sample_value(name, labels) or 0.0


def forward(d: Dispatcher, tenant: str, model: str, *, deadline: float = INF) -> tuple[bytes, str]:
    return asyncio.run(d.forward(tenant, model, "", "ModelInfer", infer(model), deadline=deadline))


def fails(d: Dispatcher, tenant: str, model: str, exc: type[Exception] = Forwarded, *, deadline: float = INF):
    with pytest.raises(exc) as e:
        forward(d, tenant, model, deadline=deadline)
    return e.value


def up(cluster: ClusterView) -> set[str]:
    return {a for a, h in cluster.hosts.items() if h.state is HostState.UP}


def test_a_transport_failure_marks_the_host_down_and_the_request_goes_to_another():
    clock = FakeClock()
    hosts = FakeHosts(clock, script=[transport_error()])
    cluster = ready_everywhere(3, ("acme", "m"))
    d = dispatcher(clock, hosts, cluster)
    _, served_by = forward(d, "acme", "m")
    first, second = hosts.calls
    assert first.address != second.address == served_by
    assert cluster.hosts[first.address].state is HostState.DOWN and up(cluster) == set(HOSTS[:3]) - {first.address}
    assert metric(d, "mmhost_router_hosts_marked_down_total") == 1
    assert metric(d, "mmhost_router_retries_total", reason="host_down") == 1
    assert not d.local.inflight_for("acme/m")  # every attempt's in-flight count was given back
    # the host stays out of placement: later requests never go there
    for _ in range(10):
        assert forward(d, "acme", "m")[1] != first.address


def test_a_killed_host_is_found_by_the_request_that_reaches_it_and_left_out_after():
    clock = FakeClock()
    hosts = FakeHosts(clock)
    cluster = ready_everywhere(2, ("acme", "m"))
    d = dispatcher(clock, hosts, cluster)
    _, preferred = forward(d, "acme", "m")  # both hosts idle: placement prefers one of them every time
    other = next(a for a in HOSTS[:2] if a != preferred)
    hosts.down.add(preferred)
    hosts.calls.clear()
    for _ in range(10):
        assert forward(d, "acme", "m")[1] == other
    assert [c.address for c in hosts.calls] == [preferred] + [other] * 10
    assert cluster.hosts[preferred].state is HostState.DOWN and up(cluster) == {other}


def test_a_draining_host_is_marked_down_and_the_request_goes_to_another():
    clock = FakeClock()
    hosts = FakeHosts(clock, script=[refusal(C.UNAVAILABLE, "draining", 50)])
    cluster = ready_everywhere(2, ("acme", "m"))
    d = dispatcher(clock, hosts, cluster)
    _, served_by = forward(d, "acme", "m")
    first, second = hosts.calls
    assert served_by == second.address != first.address
    assert cluster.hosts[first.address].state is HostState.DOWN and up(cluster) == {second.address}


def test_a_models_load_failure_is_final_marks_nothing_down_and_other_tenants_keep_flowing():
    """The failure-isolation promise: one tenant's broken model fails only that model's requests."""
    clock = FakeClock()

    def host(call: Call):
        if call.tenant == "acme" and call.model == "broken":
            return refusal(C.UNAVAILABLE, "load_failed", 1000)
        return ok(call)

    hosts = FakeHosts(clock, behaviour=host)
    cluster = cluster_of(status("h1:1"))  # one host: everything lands on the host that failed the load
    d = dispatcher(clock, hosts, cluster, max_attempts=3)
    err = fails(d, "acme", "broken")
    assert (err.code, err.reason, err.retry_after_ms) == (C.UNAVAILABLE, "load_failed", 1000)
    assert len(hosts.calls) == 1  # final: not retried
    assert up(cluster) == {"h1:1"} and metric(d, "mmhost_router_hosts_marked_down_total") == 0
    for i in range(5):
        _, served_by = forward(d, "globex", f"m{i}")
        assert served_by == "h1:1"
    assert forward(d, "acme", "other")[1] == "h1:1"
    fails(d, "acme", "broken")  # and the broken model keeps failing as itself
    assert up(cluster) == {"h1:1"}


def test_no_capacity_tries_another_host_and_marks_none_down():
    clock = FakeClock()
    hosts = FakeHosts(clock, script=[refusal(C.UNAVAILABLE, "no_capacity", 100)])
    cluster = cluster_of(*(status(a) for a in HOSTS[:3]))
    d = dispatcher(clock, hosts, cluster)
    _, served_by = forward(d, "acme", "m")
    first, second = hosts.calls
    assert first.address != second.address == served_by
    assert up(cluster) == set(HOSTS[:3])
    assert metric(d, "mmhost_router_retries_total", reason="elsewhere") == 1


def test_the_caller_gets_a_hosts_refusal_unchanged_and_it_is_not_retried():
    clock = FakeClock()
    hosts = FakeHosts(clock, script=[refusal(C.RESOURCE_EXHAUSTED, "queue_timeout", 20)])
    cluster = ready_everywhere(3, ("acme", "m"))
    d = dispatcher(clock, hosts, cluster)
    err = fails(d, "acme", "m")
    assert (err.code, err.reason, err.retry_after_ms, err.message) == (C.RESOURCE_EXHAUSTED, "queue_timeout", 20,
                                                                        "refused: queue_timeout")
    assert len(hosts.calls) == 1 and up(cluster) == set(HOSTS[:3])


def test_retries_stop_when_the_retry_budget_is_spent():
    clock = FakeClock()
    hosts = FakeHosts(clock, behaviour=lambda call: refusal(C.UNAVAILABLE, "no_capacity", 100))
    cluster = ready_everywhere(3, ("acme", "m"))
    d = dispatcher(clock, hosts, cluster, budget=RetryBudget(ratio=0.0, cap=1.0))  # one retry, never earned back
    fails(d, "acme", "m")
    assert len(hosts.calls) == 2  # the first request spends the budget's one token on a retry, then stops
    assert metric(d, "mmhost_router_retry_budget_exhausted_total") == 1
    hosts.calls.clear()
    err = fails(d, "acme", "m")
    assert len(hosts.calls) == 1 and err.reason == "no_capacity"
    assert metric(d, "mmhost_router_retry_budget_exhausted_total") == 2


def test_retries_are_earned_back_by_requests():
    clock = FakeClock()
    hosts = FakeHosts(clock)
    cluster = ready_everywhere(3, ("acme", "m"))
    d = dispatcher(clock, hosts, cluster, budget=RetryBudget(ratio=0.5, cap=1.0))
    d.budget.tokens = 0.0
    forward(d, "acme", "m")
    forward(d, "acme", "m")  # two requests earn one retry
    hosts.script.append(transport_error())
    forward(d, "acme", "m")
    assert metric(d, "mmhost_router_retries_total", reason="host_down") == 1


def test_the_deadline_bounds_the_total_time_and_each_attempt_gets_what_is_left():
    clock = FakeClock()
    hosts = FakeHosts(clock, latency=0.4, behaviour=lambda call: refusal(C.UNAVAILABLE, "no_capacity", 100))
    cluster = ready_everywhere(5, ("acme", "m"))
    d = dispatcher(clock, hosts, cluster, max_attempts=5)
    start = clock()
    err = fails(d, "acme", "m", DeadlineExceeded, deadline=start + 1.0)
    assert err.reason == "deadline"
    assert [c.timeout for c in hosts.calls] == pytest.approx([1.0, 0.6, 0.2])
    assert clock() - start == pytest.approx(1.2)  # the third attempt ran out; no fourth was started
    assert len(hosts.calls) == 3 < d.max_attempts


def test_a_deadline_already_past_forwards_nothing():
    clock = FakeClock()
    hosts = FakeHosts(clock)
    d = dispatcher(clock, hosts, ready_everywhere(2, ("acme", "m")))
    fails(d, "acme", "m", DeadlineExceeded, deadline=clock() - 0.001)
    assert hosts.calls == []


def test_without_a_deadline_attempts_have_no_timeout():
    clock = FakeClock()
    hosts = FakeHosts(clock, latency=5.0, script=[transport_error()])
    d = dispatcher(clock, hosts, ready_everywhere(2, ("acme", "m")))
    forward(d, "acme", "m")
    assert [c.timeout for c in hosts.calls] == [None, None]


def test_at_most_max_attempts_each_on_another_host():
    clock = FakeClock()
    hosts = FakeHosts(clock, behaviour=lambda call: refusal(C.UNAVAILABLE, "no_capacity", 100))
    cluster = ready_everywhere(5, ("acme", "m"))
    d = dispatcher(clock, hosts, cluster, max_attempts=3)
    err = fails(d, "acme", "m")
    assert err.reason == "no_capacity" and len(hosts.calls) == 3
    assert len({c.address for c in hosts.calls}) == 3


def test_when_every_host_has_been_tried_the_last_hosts_answer_is_returned():
    clock = FakeClock()
    hosts = FakeHosts(clock, behaviour=lambda call: refusal(C.UNAVAILABLE, "no_capacity", 100))
    d = dispatcher(clock, hosts, ready_everywhere(2, ("acme", "m")), max_attempts=5)
    err = fails(d, "acme", "m")
    assert err.reason == "no_capacity" and len(hosts.calls) == 2


def test_no_host_at_all_is_unavailable_with_retry_after():
    clock = FakeClock()
    d = dispatcher(clock, FakeHosts(clock), ClusterView())
    err = fails(d, "acme", "m", Unavailable)
    assert (err.reason, err.retry_after_ms) == ("no_host", 500)


def test_the_tenant_header_and_the_body_are_forwarded_unchanged():
    clock = FakeClock()
    hosts = FakeHosts(clock)
    d = dispatcher(clock, hosts, ready_everywhere(1, ("acme", "m")))
    body = infer("m", "req-1")
    resp, _ = asyncio.run(d.forward("acme", "m", "", "ModelInfer", body))
    assert hosts.calls[0].body is body and hosts.calls[0].tenant == "acme" and resp


def test_a_first_request_starts_one_load_and_the_next_ones_wait_on_it():
    clock = FakeClock()
    hosts = FakeHosts(clock)
    d = dispatcher(clock, hosts, cluster_of(*(status(a) for a in HOSTS[:3])))
    targets = {forward(d, "acme", "m")[1] for _ in range(5)}
    assert len(targets) == 1 and set(d.local.pending_for("acme/m")) == targets
    assert d.metrics.registry.get_sample_value("mmhost_router_placements_total", {"reason": "loading"}) == 4


def test_a_hot_model_gets_another_copy_without_the_request_waiting():
    clock = FakeClock()

    def host(call: Call):
        if call.method == "RepositoryModelLoad":
            return refusal(C.UNAVAILABLE, "no_capacity", 100)
        return ok(call)

    hosts = FakeHosts(clock, behaviour=host)
    cluster = cluster_of(status("h1:1", models=(("acme", "m", "READY"),), queue_depth=3), status("h2:1"))
    d = dispatcher(clock, hosts, cluster, placement=PlacementConfig(hot_queue_depth=2))

    async def go():
        resp = await d.forward("acme", "m", "", "ModelInfer", infer("m"))
        assert d.local.pending_for("acme/m").keys() == {"h2:1"}  # counted as loading there at once
        await asyncio.gather(*list(d.background))
        return resp

    _, served_by = asyncio.run(go())
    assert served_by == "h1:1"
    load = next(c for c in hosts.calls if c.method == "RepositoryModelLoad")
    assert (load.address, load.model, load.tenant) == ("h2:1", "m", "acme")
    assert not d.local.pending_for("acme/m")  # the copy failed to load: no longer counted as loading
    assert metric(d, "mmhost_router_replications_total") == 1


def test_a_hot_model_served_elsewhere_gets_another_copy_when_asked():
    """The fast lane's calls never pass through forward: its sync asks replicate_if_hot, the same rule."""
    clock = FakeClock()
    hosts = FakeHosts(clock)
    cold = cluster_of(status("h1:1", models=(("acme", "m", "READY"),), queue_depth=1), status("h2:1"))
    d = dispatcher(clock, hosts, cold, placement=PlacementConfig(hot_queue_depth=2))
    assert d.replicate_if_hot("acme", "m", clock()) is None  # not hot: nothing loaded
    hot = cluster_of(status("h1:1", models=(("acme", "m", "READY"),), queue_depth=3), status("h2:1"))
    d = dispatcher(clock, hosts, hot, placement=PlacementConfig(hot_queue_depth=2))

    async def go():
        first = d.replicate_if_hot("acme", "m", clock())
        again = d.replicate_if_hot("acme", "m", clock())  # the copy is loading: not a second one
        await asyncio.gather(*list(d.background))
        return first, again

    assert asyncio.run(go()) == ("h2:1", None)
    loads = [c for c in hosts.calls if c.method == "RepositoryModelLoad"]
    assert [(c.address, c.model, c.tenant) for c in loads] == [("h2:1", "m", "acme")]
    assert not [c for c in hosts.calls if c.method == "ModelInfer"]  # no request was sent or counted
    assert metric(d, "mmhost_router_replications_total") == 1


def test_broadcast_returns_each_hosts_answer_or_error_in_order():
    clock = FakeClock()
    hosts = FakeHosts(clock, down={"h2:1"})
    cluster = cluster_of(*(status(a) for a in HOSTS[:3]))
    d = dispatcher(clock, hosts, cluster)
    out = asyncio.run(d.broadcast("acme", ["h1:1", "h2:1", "h3:1"], "ModelStatistics", b"", timeout=2.0))
    assert out[0] == b"" and out[2] == b"" and out[1].code is C.UNAVAILABLE
    assert {c.timeout for c in hosts.calls} == {2.0} and up(cluster) == set(HOSTS[:3])  # nothing marked down


def test_stop_cancels_the_loads_of_extra_copies_still_under_way():
    clock = FakeClock()
    started = []

    class SlowLoads(FakeHosts):
        async def unary(self, address, method, body, *, timeout, metadata, trailers=None, lane=""):
            if method == "RepositoryModelLoad":
                started.append(address)
                await asyncio.sleep(3600)
            return await super().unary(address, method, body, timeout=timeout, metadata=metadata, trailers=trailers)

    cluster = cluster_of(status("h1:1", models=(("acme", "m", "READY"),), queue_depth=3), status("h2:1"))
    d = dispatcher(clock, SlowLoads(clock), cluster, placement=PlacementConfig(hot_queue_depth=2))

    async def go():
        await d.forward("acme", "m", "", "ModelInfer", infer("m"))
        await asyncio.sleep(0)  # the copy's load starts
        assert started == ["h2:1"] and len(d.background) == 1
        await d.stop()
        assert not d.background

    asyncio.run(go())
