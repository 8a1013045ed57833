"""The router's gRPC servicer as a thin adapter, called directly with a fake call context over the real
dispatcher and fake hosts: one deadline rule for admission and forwarding (the `timeout` parameter counts
for both), authentication first, the access log, statistics added up across hosts."""

from __future__ import annotations

import asyncio
import io
import json
import random

import pytest

from ground.errors import Forwarded, InvalidArgument, ResourceExhausted, Unauthenticated, Unavailable
from ground.served import Served
from ground.tenancy import TenantLimits
from ground.wire import REASON, SERVED
from ground.settings import RouterSettings
from protos import grpc_service_pb2 as pb
from protos import hostd_control_pb2 as hc
from router.accesslog import AccessLog
from router.admission import Admission
from router.auth import KeyIndex, hash_key, new_key
from router.cluster import ClusterView
from router.directory import ModelDirectory
from router.dispatcher import Dispatcher
from router.failover import RetryBudget
from router.host_client import HostError
from router.local_load import LocalLoad
from router.metrics import RouterMetrics
from router.placement_policy import PlacementConfig
from router.servicer import RouterServicer
from router.stats_merge import merge_statistics
from tests.router.fakes import C, Call, FakeClock, FakeHosts, cluster_of, infer, ok, refusal, status

KEY = new_key()


class FakeContext:
    """What the servicer reads off a call: its metadata and the time left on its gRPC deadline."""

    def __init__(self, time_remaining: float | None = None, key: str | None = KEY) -> None:
        self._remaining = time_remaining
        self._md = (("authorization", f"Bearer {key}"),) if key else ()

    def invocation_metadata(self):
        return self._md

    def time_remaining(self) -> float | None:
        return self._remaining


class Rig:
    def __init__(self, cluster: ClusterView | None = None, *, default_timeout_s: float = 0.0, behaviour=ok) -> None:
        self.clock = FakeClock()
        self.hosts = FakeHosts(self.clock, behaviour=behaviour)
        self.cluster = cluster or cluster_of(status("h1:1", models=(("acme", "m", "READY"),)))
        self.log = io.StringIO()
        metrics = RouterMetrics()
        settings = RouterSettings(default_timeout_s=default_timeout_s)
        self.dispatcher = Dispatcher(hosts=self.hosts, cluster=self.cluster, local=LocalLoad(), metrics=metrics,
                                     clock=self.clock, max_attempts=3, budget=RetryBudget(0.2, 100),
                                     placement=PlacementConfig(hot_queue_depth=0), rng=random.Random(0))
        self.servicer = RouterServicer(settings=settings, keys=KeyIndex({hash_key(KEY): "acme"}),
                                       directory=ModelDirectory(None, 5.0, 1.0), cluster=self.cluster,
                                       dispatcher=self.dispatcher, metrics=metrics, access_log=AccessLog(self.log),
                                       clock=self.clock, wall_clock=lambda: 1_700_000_000.0, admission=Admission())

    def infer(self, body: bytes, context: FakeContext | None = None) -> bytes:
        return asyncio.run(self.servicer.ModelInfer(body, context or FakeContext()))

    def lines(self) -> list[dict]:
        """The access log's lines so far (written now: the writer thread is not started here)."""
        self.servicer.access_log.flush()
        return [json.loads(line) for line in self.log.getvalue().splitlines()]

    def timeouts(self) -> list[float | None]:
        return [c.timeout for c in self.hosts.calls]


def test_a_timeout_parameter_shorter_than_the_grpc_deadline_is_the_forwarding_deadline():
    rig = Rig()
    rig.infer(infer("m", timeout_us=200_000), FakeContext(time_remaining=10.0))
    assert rig.timeouts() == [pytest.approx(0.2)]


def test_the_grpc_deadline_wins_when_it_is_shorter_than_the_timeout_parameter():
    rig = Rig()
    rig.infer(infer("m", timeout_us=5_000_000), FakeContext(time_remaining=0.05))
    assert rig.timeouts() == [pytest.approx(0.05)]


def test_calls_without_a_deadline_get_the_default_timeout_unless_they_set_one():
    rig = Rig(default_timeout_s=3.0)
    rig.infer(infer("m"))
    rig.infer(infer("m", timeout_us=250_000))
    assert rig.timeouts() == [pytest.approx(3.0), pytest.approx(0.25)]


def test_no_deadline_and_no_default_forwards_without_a_timeout():
    rig = Rig()
    rig.infer(infer("m"))
    assert rig.timeouts() == [None]


def test_admission_and_forwarding_read_the_same_deadline():
    """A model that takes ~500 ms: a 200 ms `timeout` parameter is refused at the door as infeasible, even
    though the gRPC deadline would allow it; the same call without the parameter goes through."""
    s = status("h1:1", models=(("acme", "m", "READY"),))
    s.models[0].CopyFrom(hc.ModelStatus(tenant="acme", model="m", version="1", state="READY", compute_ms_recent=500))
    rig = Rig(cluster_of(s))
    with pytest.raises(Unavailable) as e:
        rig.infer(infer("m", timeout_us=200_000), FakeContext(time_remaining=10.0))
    assert e.value.reason == "deadline_infeasible" and rig.hosts.calls == []
    rig.infer(infer("m"), FakeContext(time_remaining=10.0))
    assert rig.timeouts() == [pytest.approx(10.0)]


def test_the_deadline_counts_from_arrival():
    """Time spent before forwarding (catalog, admission) comes off what the host is given."""
    rig = Rig()

    async def slow_check(tenant, model, version=""):
        rig.clock.advance(0.15)

    rig.servicer.directory.check = slow_check  # the catalog lookup takes 150 ms of the fake clock
    rig.infer(infer("m", timeout_us=200_000), FakeContext(time_remaining=10.0))
    assert rig.timeouts() == [pytest.approx(0.05)]


def test_model_calls_other_than_infer_forward_with_the_grpc_deadline():
    rig = Rig()
    body = pb.ModelMetadataRequest(name="m").SerializeToString()
    asyncio.run(rig.servicer.ModelMetadata(body, FakeContext(time_remaining=4.0)))
    assert rig.timeouts() == [pytest.approx(4.0)] and rig.hosts.calls[0].method == "ModelMetadata"


def test_without_a_key_nothing_is_forwarded():
    rig = Rig()
    with pytest.raises(Unauthenticated):
        rig.infer(infer("m"), FakeContext(key=None))
    with pytest.raises(Unauthenticated):
        rig.infer(infer("m"), FakeContext(key=KEY + "x"))
    assert rig.hosts.calls == []


def test_a_malformed_request_is_invalid_argument():
    rig = Rig()
    with pytest.raises(InvalidArgument):
        rig.infer(b"\x0a\x05ab")
    with pytest.raises(InvalidArgument):
        rig.infer(infer(""))
    assert rig.hosts.calls == []


def test_the_access_log_names_the_served_version_host_and_id():
    def host(call: Call):
        rig.clock.advance(0.002)
        return pb.ModelInferResponse(model_name="m", model_version="7", id="r1",
                                     raw_output_contents=[b"\0" * 1000]).SerializeToString()

    rig = Rig(behaviour=host)
    body = infer("m", "r1")
    resp = rig.infer(body)
    (rec,) = rig.lines()
    assert (rec["tenant"], rec["model"], rec["version"], rec["host"], rec["id"], rec["status"]) == (
        "acme", "m", "7", "h1:1", "r1", "OK")
    assert rec["total_ms"] == pytest.approx(2.0) and rec["bytes_in"] == len(body) and rec["bytes_out"] == len(resp)
    assert rec["ts"] == 1_700_000_000.0


def test_a_hosts_refusal_reaches_the_caller_and_the_access_log():
    rig = Rig(behaviour=lambda call: refusal(C.RESOURCE_EXHAUSTED, "queue_full", 5))
    with pytest.raises(Forwarded) as e:
        rig.infer(infer("m"))
    assert e.value.code is C.RESOURCE_EXHAUSTED and e.value.reason == "queue_full"
    (rec,) = rig.lines()
    assert (rec["status"], rec["reason"], rec["host"]) == ("RESOURCE_EXHAUSTED", "queue_full", "h1:1")
    assert rig.servicer.admission.inflight("acme") == 0  # the concurrency place was given back


def test_the_access_log_line_carries_what_the_hostd_says_served_it():
    rig = Rig()
    rig.hosts.trailing = ((SERVED, Served("3", 5_300_000, 0.25, 0.0015, 0.002).encode()),)
    rig.infer(infer("m", "r2"))
    (rec,) = rig.lines()
    assert (rec["version"], rec["size_bytes"], rec["host"], rec["status"], rec["reason"]) == (
        "3", 5_300_000, "h1:1", "OK", "")
    assert (rec["load_ms"], rec["queue_ms"], rec["compute_ms"]) == (250.0, 1.5, 2.0)


def test_a_hostd_refusal_logs_its_host_version_size_and_reason():
    served = Served("2", 75_000, 0.0, 0.0, 0.0).encode()
    rig = Rig(behaviour=lambda call: HostError(C.UNAVAILABLE, "model failed to load",
                                               ((REASON, "load_failed"), (SERVED, served))))
    with pytest.raises(Forwarded):
        rig.infer(infer("m"))
    (rec,) = rig.lines()
    assert (rec["status"], rec["reason"], rec["host"], rec["version"], rec["size_bytes"]) == (
        "UNAVAILABLE", "load_failed", "h1:1", "2", 75_000)


def test_the_routers_own_refusals_are_logged_with_their_reason_and_no_host():
    rig = Rig(cluster_of(status("h1:1", models=(("acme", "m", "READY"),))))
    rig.servicer.admission.replace({"acme": TenantLimits(rate=0.001, burst=1)})
    rig.infer(infer("m"))  # the bucket's one token
    with pytest.raises(ResourceExhausted):
        rig.infer(infer("m"))
    with pytest.raises(InvalidArgument):
        rig.infer(infer(""))
    _, quota, invalid = rig.lines()
    assert (quota["status"], quota["host"], quota["load_ms"]) == ("RESOURCE_EXHAUSTED", "", None)
    assert quota["reason"].startswith("quota_")
    assert (invalid["status"], invalid["reason"]) == ("INVALID_ARGUMENT", "invalid_argument")


def _stats(name: str, version: str, count: int, ns: int, batch: int = 1) -> pb.ModelStatistics:
    s = pb.ModelStatistics(name=name, version=version, inference_count=count, execution_count=count,
                           last_inference=count)
    s.inference_stats.success.count, s.inference_stats.success.ns = count, ns
    b = s.batch_stats.add(batch_size=batch)
    b.compute_infer.count, b.compute_infer.ns = count, ns
    return s


def test_statistics_are_added_up_across_hosts():
    per_host = {
        "h1:1": [_stats("m", "1", 2, 100), pb.ModelStatistics(name="idle")],
        "h2:1": [_stats("m", "1", 3, 50, batch=2), _stats("n", "1", 1, 10)],
    }

    def host(call: Call):
        return pb.ModelStatisticsResponse(model_stats=per_host[call.address]).SerializeToString()

    rig = Rig(cluster_of(status("h1:1"), status("h2:1"), status("h3:1")), behaviour=host)
    rig.hosts.down.add("h3:1")  # a host that cannot answer is left out
    out = pb.ModelStatisticsResponse.FromString(
        asyncio.run(rig.servicer.ModelStatistics(pb.ModelStatisticsRequest().SerializeToString(), FakeContext())))
    assert [(s.name, s.version) for s in out.model_stats] == [("m", "1"), ("n", "1")]
    m = out.model_stats[0]
    assert (m.inference_count, m.last_inference, m.inference_stats.success.count, m.inference_stats.success.ns) == (
        5, 3, 5, 150)
    assert sorted(b.batch_size for b in m.batch_stats) == [1, 2]


def test_merge_statistics_answers_a_named_model_nobody_ran_with_zeros():
    out = merge_statistics([pb.ModelStatisticsResponse(model_stats=[pb.ModelStatistics(name="m")])], "m", "2")
    assert [(s.name, s.version, s.inference_count) for s in out.model_stats] == [("m", "2", 0)]


def test_unload_goes_to_every_holder_and_not_found_is_fine():
    def host(call: Call):
        return refusal(C.NOT_FOUND, "not_found") if call.address == "h2:1" else b""

    both = (("acme", "m", "READY"),)
    rig = Rig(cluster_of(status("h1:1", models=both), status("h2:1", models=both), status("h3:1")), behaviour=host)
    body = pb.RepositoryModelUnloadRequest(model_name="m").SerializeToString()
    asyncio.run(rig.servicer.RepositoryModelUnload(body, FakeContext(time_remaining=3.0)))
    assert sorted(c.address for c in rig.hosts.calls) == ["h1:1", "h2:1"]
