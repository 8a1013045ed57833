"""Python-lane workers on real processes: a router with fast_lane=haproxy and fast_lane_workers=1 (HAProxy in
front, one more router process beside the router) over one hostd in embedded mode. Two tenants with quotas
(so the Python lane serves them) calling at once end up on different router processes, each call served by one
process only; a worker killed under traffic is started again while its tenant is served by the router; the
workers end with the router, even when the router is killed."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from pathlib import Path

import grpc
import pytest

from catalog.publish import publish_version
from catalog.repository import ModelRepository
from mmhost.demo_models import build_onnx_mlp, onnx_manifest
from router.tenants import FileTenants
from storage_adapters.local import LocalStorage
from tests.hostd_proc import HostdProc, metric_value
from tests.router.conftest import IN_DIM, auth, infer_request
from tests.router.router_proc import RouterProc
from tests.router.test_cluster import wait_until
from tests.router.test_fast_lane import access, after_syncs

pytestmark = pytest.mark.timeout(180)

GENEROUS = {"rate": 100000.0, "burst": 100000}  # a quota, so the Python lane serves them, that never refuses


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    work = tmp_path_factory.mktemp("lane-workers")
    build_onnx_mlp(work / "m.onnx", (IN_DIM, 16, 4))
    repo = ModelRepository(LocalStorage(work / "store"))
    tenants = FileTenants(work / "tenants.json")
    keys = {}
    for tenant in ("busy", "quiet"):
        publish_version(repo, onnx_manifest(tenant, "m", "1", work / "m.onnx", "model.onnx"),
                        {"model.onnx": work / "m.onnx"})
        keys[tenant] = tenants.create(tenant, overrides=GENEROUS)
    return work, keys


def start(work: Path, host: HostdProc) -> RouterProc:
    return RouterProc(work, ["--hosts", host.addr, "--tenants", str(work / "tenants.json"), "--store",
                             str(work / "store"), "--refresh-interval", "0.2", "--fast-lane", "haproxy",
                             "--fast-lane-workers", "1"],
                      env={"MMHOST_ROUTER_FAST_LANE_CHECK_INTERVAL_S": "0.2"})


@pytest.fixture(scope="module")
def cluster(store):
    work, keys = store
    host = HostdProc(str(work / "store"), work, tenant="nobody")
    router = start(work, host)
    yield work, router, keys
    router.stop()
    host.stop()


def children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(x) for x in (task / "children").read_text().split()]
    return out


def worker_pids(router: RouterProc) -> list[int]:
    return [p for p in children(router.proc.pid)
            if b"router.lane_workers" in Path(f"/proc/{p}/cmdline").read_bytes()]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


class Caller:
    """Calls one tenant's model from `n` threads until stopped; records every call's id and outcome."""

    def __init__(self, router: RouterProc, tenant: str, key: str, n: int) -> None:
        self.r, self.tenant, self.md = router, tenant, auth(key)
        self.ok: list[str] = []
        self.failed: list[str] = []
        self._stop = threading.Event()
        self.threads = n
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(n)]
        self._n = 0
        self._lock = threading.Lock()

    def _run(self, i: int) -> None:
        while not self._stop.is_set():
            with self._lock:
                self._n += 1
                rid = f"{self.tenant}-{i}-{self._n}"
            try:
                self.r.stub.ModelInfer(infer_request("m", request_id=rid), metadata=self.md, timeout=30)
                self.ok.append(rid)
            except grpc.RpcError as e:
                self.failed.append(f"{rid}: {e.code().name} {e.details()}")

    def __enter__(self) -> Caller:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=30)


def lanes(r: RouterProc) -> dict[str, float]:
    text = r.metrics_text()
    return {lane: metric_value(text, "mmhost_router_lane_tenants", lane=lane) for lane in ("0", "1")}


def _at(path: Path) -> RouterProc:
    """access() reads a RouterProc's access_log: this one's at `path`."""
    rp = RouterProc.__new__(RouterProc)
    rp.access_log = path
    return rp


def served_by(r: RouterProc) -> dict[str, str]:
    """request id -> "router" or "worker", from the two access logs."""
    out: dict[str, str] = {}
    for who, path in (("router", r.access_log), ("worker", Path(f"{r.access_log}.w1"))):
        for line in access(_at(path)):
            out[line["id"]] = who
    return out


def test_two_busy_tenants_are_served_by_different_processes(cluster):
    work, r, keys = cluster
    assert len(worker_pids(r)) == 1
    # the worker runs the router's event loop (uvloop by default, ground/eventloop.py), as the router does
    starts = [line for line in r.log_path.read_text(errors="replace").splitlines() if "router serving on" in line]
    assert sorted("lane-worker-1" in line for line in starts) == [False, True], starts
    assert r.event_loops() == ["uvloop", "uvloop"], starts
    with Caller(r, "busy", keys["busy"], 3) as busy, Caller(r, "quiet", keys["quiet"], 1) as quiet:
        # both start on the router itself; at a refresh the policy gives one of them the worker
        wait_until(lambda: lanes(r) == {"0": 1.0, "1": 1.0}, timeout=30, what="one tenant on each process")
        after_syncs(r)  # the lanes map that says so is in HAProxy
        # a thread's call in flight now may have been sent before: each thread's first answer from here is left out
        mark_busy, mark_quiet = len(busy.ok) + busy.threads, len(quiet.ok) + quiet.threads
        wait_until(lambda: len(busy.ok) > mark_busy + 20 and len(quiet.ok) > mark_quiet + 5, timeout=30,
                   what="calls of both tenants after the lanes settled")
    assert not busy.failed and not quiet.failed, (busy.failed[:3], quiet.failed[:3])
    after = {"busy": busy.ok[mark_busy:], "quiet": quiet.ok[mark_quiet:]}
    assert len(after["busy"]) > 20 and len(after["quiet"]) > 5
    everyone = set(busy.ok + quiet.ok)  # the access logs are written in batches by a thread
    wait_until(lambda: everyone <= served_by(r).keys(), timeout=10, what="every call in an access log")
    who = served_by(r)
    places = {t: {who.get(rid, "missing") for rid in ids} for t, ids in after.items()}
    assert all(len(p) == 1 for p in places.values()), places  # each tenant on one process, every call logged
    assert places["busy"] != places["quiet"], places  # and not the same one
    assert "missing" not in places["busy"] | places["quiet"]
    # every call was logged by exactly one process
    lines = [line["id"] for path in (r.access_log, Path(f"{r.access_log}.w1"))
             for line in access(_at(path))]
    assert len(lines) == len(set(lines))
    # one metrics port for both processes: the worker's series come through the router's, labelled with it
    on_worker = next(t for t, p in places.items() if p == {"worker"})
    on_router = next(t for t, p in places.items() if p == {"router"})
    text = r.metrics_text()
    name = "mmhost_router_requests_total"
    assert metric_value(text, name, tenant=on_worker, lane_worker="1") >= len(after[on_worker])
    assert metric_value(text, name, tenant=on_router, lane_worker="1") == 0  # it was the router's all along
    assert metric_value(text, name, tenant=on_router) >= len(after[on_router])
    assert metric_value(text, "process_resident_memory_bytes", lane_worker="1") > 0  # the worker's own process
    check = subprocess.run(["promtool", "check", "metrics"], input=text.encode(), capture_output=True, timeout=30)
    assert check.returncode in (0, 3) and b"error while linting" not in check.stderr, check.stderr  # 3: lint only


def test_a_killed_worker_is_started_again_and_its_tenant_served_meanwhile(cluster):
    work, r, keys = cluster
    [pid] = worker_pids(r)
    text = r.metrics_text()
    restarts = metric_value(text, "mmhost_router_lane_worker_restarts_total")
    started = metric_value(text, "process_start_time_seconds", lane_worker="1")
    assert started > 0  # the worker's series, through the router's port
    with Caller(r, "busy", keys["busy"], 2) as busy, Caller(r, "quiet", keys["quiet"], 1) as quiet:
        wait_until(lambda: lanes(r) == {"0": 1.0, "1": 1.0}, timeout=30, what="one tenant on each process")
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: metric_value(r.metrics_text(), "mmhost_router_lane_worker_restarts_total") > restarts,
                   timeout=60, what="the worker started again")
        wait_until(lambda: metric_value(r.metrics_text(), "mmhost_router_lane_workers_up") == 1, timeout=30,
                   what="the worker serving")
        mark = len(busy.ok) + len(quiet.ok)
        wait_until(lambda: len(busy.ok) + len(quiet.ok) > mark + 10, timeout=30, what="calls answered after the "
                   "restart")
    [new] = worker_pids(r)
    assert new != pid
    # the new worker's series come through the router's port again: from the metrics port it said at its start
    wait_until(lambda: metric_value(r.metrics_text(), "process_start_time_seconds", lane_worker="1") > started,
               timeout=30, what="the restarted worker's series on the router's metrics port")
    # the calls in flight on the killed process fail (it died with them); every other call is answered
    failed = busy.failed + quiet.failed
    assert len(failed) <= 3, failed  # one call per calling thread at most
    assert all("UNAVAILABLE" in f or "INTERNAL" in f or "CANCELLED" in f for f in failed), failed


def haproxy_pids(router: RouterProc) -> list[int]:
    return [p for p in children(router.proc.pid) if b"haproxy" in Path(f"/proc/{p}/cmdline").read_bytes()]


def test_workers_and_haproxy_end_with_the_router_even_when_it_is_killed(store):
    work, keys = store
    host = HostdProc(str(work / "store"), work, tenant="nobody")
    try:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            r = start(work, host)
            [pid] = worker_pids(r)
            [hp] = haproxy_pids(r)
            r.stop(sig)
            for p, what in ((pid, "worker"), (hp, "HAProxy")):
                wait_until(lambda p=p: not alive(p), timeout=20, what=f"the {what} gone after {sig.name}")
    finally:
        host.stop()


def test_a_worker_gets_the_routers_settings_but_its_own_port_logs_and_no_tenant_facing_extras():
    from ground.settings import RouterSettings
    from router.lane_workers import worker_serves_metrics, worker_settings

    parent = RouterSettings(listen="0.0.0.0:8000", fast_lane="haproxy", fast_lane_workers=2, plaintext=True,
                            metrics_host="0.0.0.0", metrics_port=9100, access_log="/var/log/mmhost/access.jsonl",
                            rest_listen="0.0.0.0:8080", health_port=8081, uploads=True, redis_url="redis://r:6379/0", max_attempts=5)
    w = RouterSettings(**worker_settings(parent.model_dump(mode="json"), 2))
    assert (w.listen, w.fast_lane, w.fast_lane_workers) == ("127.0.0.1:0", "off", 0)
    # metrics on a free loopback port the worker says at start (the router's port re-exports them), not 9102:
    # no fixed port next to the router's to clash with
    assert (w.metrics_host, w.metrics_port) == ("127.0.0.1", 0) and worker_serves_metrics(parent.model_dump(mode="json"))
    assert w.access_log == "/var/log/mmhost/access.jsonl.w2"
    assert not w.rest_listen and not w.health_port and not w.uploads and not w.tls_client_listen
    assert (w.redis_url, w.max_attempts) == ("redis://r:6379/0", 5)  # the rest as the router's
    assert not w.quota_router_id
    named = RouterSettings(**worker_settings(parent.model_dump(mode="json"), 1, "router-a"))
    assert named.quota_router_id == "router-a"  # counted among the live routers as the router itself
    off_parent = RouterSettings(metrics_port=0, access_log="-").model_dump(mode="json")
    off = RouterSettings(**worker_settings(off_parent, 1))
    assert (off.metrics_port, off.access_log) == (0, "-") and not worker_serves_metrics(off_parent)


def test_workers_without_the_fast_lane_are_refused_at_start(tmp_path):
    from ground.settings import RouterSettings
    from router.server import Router

    (tmp_path / "t.json").write_text("{}")
    with pytest.raises(SystemExit, match="fast_lane_workers needs fast_lane=haproxy"):
        Router(RouterSettings(fast_lane_workers=1, plaintext=True, hosts=["127.0.0.1:1"],
                              tenants_file=tmp_path / "t.json"))
