"""The shipped alert rules and dashboard on a real Prometheus (Debian's `prometheus` server, installed by
`make tools`), scraping a real cluster: redis-server, two hostds and a router in Redis mode.

The rules are loaded as shipped except for time: every duration in them (`for:`, range windows, offsets) is
divided by 60 (a rule minute is a test second), with a 1 s scrape and evaluation interval, so the whole run
stays near a minute. Rates stay per second, so every threshold holds as shipped, but one: the tenant latency SLO
(p99 > 1 s) is lowered to 1 ms, because nothing here can make requests deterministically slower than a second;
the rule, the per-tenant histogram and the query chain are what is proven.

What it drives, and the alerts that must go pending and then firing (Prometheus's /api/v1/alerts):
- traffic: a tenant within quota, a tenant 10x over its rate quota (shed storm), four corrupt models loaded
  explicitly again and again and requested (load-failure burst: an explicit load retries a failed model at
  once), calls with a wrong key; one hostd's disk tier budget larger than its filesystem, and loads on the
  other hostd of a model larger than its device budget
  -> MmhostTenantShedding, MmhostSheddingHigh, MmhostModelLoadFailures, MmhostModelLoadFailureRate,
  MmhostUnauthenticatedSpike, MmhostTenantLatencySLO, MmhostDiskTierFull, MmhostLoadsRefusedForMemory;
- then every Grafana panel's queries are evaluated (each returns data, or is listed in NEEDS_CONDITION with
  why), every PromQL query in the runbooks is evaluated, and every `mmhost` command line in the runbooks is
  run against this cluster;
- a hostd killed (SIGKILL) -> MmhostHostDown; Redis paused (SIGSTOP) -> MmhostRedisUnreachable; the last hostd
  killed -> MmhostNoEligibleHost; the router killed -> MmhostRouterDown.
Not created here: MmhostCacheHitRateCollapse (a hit rate that halves against an hour ago: a minute of steady
hits, then a collapse, would double the run), MmhostMemoryPressure (device memory held over the high watermark by models
in use, whose measured size on CPU is not predictable enough to hold it there), MmhostFastLaneDown (this
cluster's router runs without the fast lane; tests/router/test_fast_lane.py kills a router's HAProxy and sees
it come back), MmhostLaneWorkerRestarting (the same: no workers here; tests/router/test_lane_workers.py kills one and sees it
started again), MmhostEventLoopLag (a loop late by 50 ms at p99 for 10 minutes: this cluster's loops are not
saturated, and saturating one on purpose would slow every other phase); promtool tests cover them."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest
import yaml
from typer.testing import CliRunner

from catalog.publish import publish_version
from catalog.repository import ModelRepository
from mmhost.cli import app
from mmhost.demo_models import build_onnx_mlp, onnx_manifest
from protos import grpc_service_pb2 as pb
from ground.wire import TENANT_HEADER
from storage_adapters.local import LocalStorage
from tests.deploy.conftest import DEPLOY, tool
from tests.deploy.promql import grafana_to_promql
from tests.deploy.test_grafana import _targets
from tests.deploy.test_runbooks import RUNBOOKS
from tests.hostd_proc import HostdProc, metric_value
from tests.router.conftest import IN_DIM, auth, infer_request
from tests.router.router_proc import RouterProc
from tests.servers import RedisServer, free_port

pytestmark = pytest.mark.timeout(240)

RULES = DEPLOY / "prometheus" / "mmhost-alerts.rules.yaml"
SPEED = 60  # rule seconds per test second
BROKEN = [f"broken{i}" for i in range(4)]

# Dashboard queries that need what this test does not create, and why.
NEEDS_CONDITION = {
    "mmhost_device_utilization_ratio": "GPU utilization comes from NVML; these hostds run on CPU",
    "mmhost_cache_evictions_total": "no eviction: the test's models fit every tier's budget",
    "mmhost_router_retries_total": "needs a forward that fails over (a host dying mid-request); the test "
                                   "reads the panels before it kills a host",
    "mmhost_router_hostd_stream_ends_total": "needs a host that ends a router's stream (dies, or lacks HostdData); "
                                             "tests/router/test_host_streams.py counts both",
}
# Runbook command lines that are not levers to run here, and why.
NOT_RUN = {
    "mmhost sim sweep": "the simulator replays an access log; it sizes a fleet and changes nothing live",
}
# Runbook placeholders -> this cluster's names.
PLACEHOLDERS = {"T": "acme", "NOISY": "greedy", "OTHER": "globex", "M": "warm"}


def _seconds(d: str) -> int:
    n, unit = int(d[:-1]), d[-1]
    return n * {"s": 1, "m": 60, "h": 3600}[unit]


def _fast(d: str) -> str:
    return f"{max(1, _seconds(d) // SPEED)}s"


def compressed_rules() -> str:
    """The shipped rules with every duration divided by SPEED, and the SLO threshold at 1 ms."""
    groups = yaml.safe_load(RULES.read_text())["groups"]
    for g in groups:
        for r in g["rules"]:
            e = re.sub(r"\[(\d+[smh])\]", lambda m: f"[{_fast(m.group(1))}]", r["expr"])
            e = re.sub(r"offset (\d+[smh])", lambda m: f"offset {_fast(m.group(1))}", e)
            if r.get("alert") == "MmhostTenantLatencySLO":
                e = e.replace("_bucket[5s]))) > 1\n", "_bucket[5s]))) > 0.001\n", 1)
                assert "> 0.001" in e, e
            r["expr"] = e
            if "for" in r:
                r["for"] = _fast(r["for"])
    return yaml.safe_dump({"groups": groups}, sort_keys=False)


class Prometheus:
    def __init__(self, work: Path, jobs: dict[str, list[str]], rules: Path) -> None:
        self.port = free_port()
        cfg = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "900ms", "evaluation_interval": "1s"},
            "rule_files": [str(rules)],
            "scrape_configs": [{"job_name": job, "static_configs": [{"targets": t}]} for job, t in jobs.items()],
        }
        (work / "prometheus.yml").write_text(yaml.safe_dump(cfg))
        self.log_path = work / "prometheus.log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [tool("prometheus"), f"--config.file={work / 'prometheus.yml'}", f"--storage.tsdb.path={work / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            try:
                if urllib.request.urlopen(f"{self.url}/-/ready", timeout=1).status == 200:
                    break
            except OSError:
                pass
            assert self.proc.poll() is None and time.monotonic() < deadline, self.log()
            time.sleep(0.2)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]

    def api(self, path: str, **params: str) -> dict:
        q = f"?{urllib.parse.urlencode(params)}" if params else ""
        try:
            body = json.loads(urllib.request.urlopen(f"{self.url}/api/v1/{path}{q}", timeout=10).read())
        except urllib.error.HTTPError as e:  # 400 with the parse error in the body
            body = json.loads(e.read())
        assert body["status"] == "success", f"{path} {params}: {body.get('error')}"
        return body["data"]

    def query(self, q: str) -> list:
        return self.api("query", query=q)["result"]

    def alerts(self) -> list[dict]:
        return self.api("alerts")["alerts"]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
        self._log.close()


class AlertWatch:
    """Every alert state Prometheus reported, per alert name."""

    def __init__(self, prom: Prometheus) -> None:
        self.prom = prom
        self.seen: dict[str, set[str]] = {}
        self.since: dict[str, float] = {}  # alert -> latest activeAt (unix seconds) of a firing instance

    def poll(self) -> None:
        for a in self.prom.alerts():
            name = a["labels"]["alertname"]
            self.seen.setdefault(name, set()).add(a["state"])
            if a["state"] == "firing":
                self.since[name] = max(self.since.get(name, 0.0), _unix(a["activeAt"]))

    def until_firing(self, names: set[str], timeout: float, why, after: float = 0.0) -> None:
        """Every alert in `names` firing, with an instance that became active at or after `after` (unix time):
        the action that was meant to cause it, not an earlier blip."""
        t0 = time.monotonic()
        deadline = t0 + timeout
        while True:
            self.poll()
            if all("firing" in self.seen.get(n, ()) and self.since.get(n, 0.0) >= after for n in names):
                print(f"firing after {time.monotonic() - t0:.1f}s: {sorted(names)}")  # shown with pytest -s
                return
            if time.monotonic() > deadline:
                missing = {n: sorted(self.seen.get(n, ())) for n in names if "firing" not in self.seen.get(n, ())}
                pytest.fail(f"not firing after {timeout}s: {missing}\n{why()}")
            time.sleep(0.2)


def _unix(rfc3339: str) -> float:
    """Prometheus's activeAt (nanoseconds, Z) -> unix seconds."""
    from datetime import datetime

    head, _, frac = rfc3339.rstrip("Z").partition(".")
    return datetime.fromisoformat(head + "+00:00").timestamp() + float(f"0.{frac or 0}")


def cli(*args: str, env: dict[str, str]) -> str:
    res = CliRunner().invoke(app, list(args), env=env)
    assert res.exit_code == 0, f"mmhost {' '.join(args)}: {res.output}"
    return res.output


@contextmanager
def cluster(work: Path):
    """redis-server, a local store, 2 hostds (the first with a disk tier budget no filesystem here holds) and
    a router in Redis mode. Tenants: acme (unlimited) and greedy (2 requests/s) own `warm`; globex owns four
    corrupt models. Yields (redis, hostds, router, keys, env)."""
    (work / "redis").mkdir()
    redis = RedisServer(work / "redis")
    procs: list = []
    try:
        store = work / "store"
        repo = ModelRepository(LocalStorage(store))
        build_onnx_mlp(work / "a.onnx", (IN_DIM, 16, 4))
        build_onnx_mlp(work / "big.onnx", (IN_DIM, 1024, 1024, 4))  # 4 MB: more than hostd 1's device budget
        for tenant, name, f in [("acme", "warm", "a"), ("greedy", "warm", "a"), ("acme", "big", "big")] + [
                ("globex", b, "a") for b in BROKEN]:
            publish_version(repo, onnx_manifest(tenant, name, "1", work / f"{f}.onnx", "model.onnx"),
                            {"model.onnx": work / f"{f}.onnx"})
        for b in BROKEN:  # same size, the sha256 check refuses it: every load fails
            f = store / "tenants" / "globex" / "models" / b / "1" / "model.onnx"
            data = f.read_bytes()
            f.write_bytes(data[:100] + bytes([data[100] ^ 0xFF]) + data[101:])
        env = {"MMHOST_REDIS_URL": redis.url, "MMHOST_STORE": str(store)}
        keys = {}
        for name, limits in [("acme", []), ("greedy", ["--rate", "2", "--burst", "2"]), ("globex", [])]:
            keys[name] = cli("tenant", "create", name, *limits, env=env).strip().splitlines()[-1]
        cli("catalog", "rebuild", env=env)
        hostd_env = {"MMHOST_HOSTD_HEARTBEAT_INTERVAL_S": "0.2", "MMHOST_HOSTD_HEARTBEAT_TTL_S": "1.5",
                     "MMHOST_HOSTD_FAILED_BACKOFF_S": "0.05", "MMHOST_HOSTD_TENANTS_REFRESH_S": "0.5"}
        own = [{"MMHOST_HOSTD_DISK_CACHE_BYTES": "1000TiB"},  # no filesystem here holds that
               {"MMHOST_HOSTD_DEVICE_MEMORY": "3MiB"}]  # `big` never fits
        with ThreadPoolExecutor(2) as ex:
            procs += list(ex.map(lambda i: HostdProc(str(store), work, env={**hostd_env, **own[i]},
                                                     args=["--redis", redis.url], tenant="nobody"), range(2)))
        router = RouterProc(work, ["--redis", redis.url, "--store", str(store), "--refresh-interval", "0.2"])
        procs.append(router)
        deadline = time.monotonic() + 30
        while metric_value(router.metrics_text(), "mmhost_router_hosts_up") < 2:
            assert time.monotonic() < deadline, router.log()
            time.sleep(0.1)
        yield redis, procs[:2], router, keys, env
    finally:
        for p in reversed(procs):
            p.stop(signal.SIGKILL)
        if redis.proc.poll() is None:
            os.kill(redis.proc.pid, signal.SIGCONT)
        redis.stop()


class Traffic:
    """Threads calling the router until stopped; errors are the point, so they are swallowed."""

    def __init__(self, router: RouterProc, keys: dict[str, str], small: HostdProc) -> None:
        self.stop_event = threading.Event()
        stub = router.stub
        big = pb.RepositoryModelLoadRequest(model_name="big")
        warm = infer_request("warm")
        # an explicit load retries a FAILED model at once (hostd's backoff is for requests): each call is a load
        broken = [pb.RepositoryModelLoadRequest(model_name=b) for b in BROKEN]
        infers = [infer_request(b) for b in BROKEN]
        n = iter(range(1 << 30))
        self.loops = [
            (0.1, lambda: stub.ModelInfer(warm, metadata=auth(keys["acme"]), timeout=10)),
            (0.05, lambda: stub.ModelInfer(warm, metadata=auth(keys["greedy"]), timeout=10)),  # 20/s on a 2/s quota
            (0.1, lambda: stub.RepositoryModelLoad(broken[next(n) % len(broken)], metadata=auth(keys["globex"]),
                                                   timeout=10)),
            (0.2, lambda: stub.ModelInfer(infers[next(n) % len(infers)], metadata=auth(keys["globex"]), timeout=10)),
            (0.2, lambda: stub.ModelInfer(warm, metadata=auth("mmhost_not-a-key"), timeout=10)),
            # an operator's load on the hostd whose device budget is too small for it (its own port, tenant header)
            (0.5, lambda: small.stub.RepositoryModelLoad(big, metadata=((TENANT_HEADER, "acme"),), timeout=10)),
        ]
        self.threads = [threading.Thread(target=self._run, args=loop, daemon=True) for loop in self.loops]
        for t in self.threads:
            t.start()

    def _run(self, period: float, call) -> None:
        while not self.stop_event.is_set():
            try:
                call()
            except grpc.RpcError:
                pass
            self.stop_event.wait(period)

    def stop(self) -> None:
        self.stop_event.set()
        for t in self.threads:
            t.join(15)


def runbook_fragments() -> list[tuple[str, str]]:
    """(page, text) of every `code` fragment in the runbooks, and of every line of their fenced blocks (comments
    after `#` dropped)."""
    out = []
    for page in sorted(RUNBOOKS.glob("*.md")):
        text = page.read_text()
        blocks = re.findall(r"^ *```[^\n]*\n(.*?)^ *```", text, flags=re.S | re.M)
        out += [(page.name, line.split("#")[0].strip()) for b in blocks for line in b.splitlines()]
        text = re.sub(r"^ *```[^\n]*\n.*?^ *```", "", text, flags=re.S | re.M)
        out += [(page.name, m) for m in re.findall(r"`([^`\n]+)`", text)]
    return out


def runbook_queries(exported: dict[str, set[str]]) -> list[tuple[str, str]]:
    """The PromQL in the runbooks: fragments naming an exported series, with a call or a label matcher."""
    names = re.compile(r"\b(" + "|".join(sorted(map(re.escape, exported), key=len, reverse=True)) + r")\b")
    return [(p, f) for p, f in runbook_fragments()
            if names.search(f) and ("(" in f or '="' in f) and not f.startswith(("mmhost ", "kubectl "))]


def runbook_commands() -> list[tuple[str, str]]:
    """`mmhost ...` command lines in the runbooks (a subcommand and something more), exports before imports
    (TenantRecovery.md moves tenants through a file) and a key rotation last."""
    found = [(p, f) for p, f in runbook_fragments() if f.startswith("mmhost ") and len(f.split()) >= 3]
    return sorted(found, key=lambda pf: ("rotate-key" in pf[1], "import" in pf[1]))


def _substitute(text: str, instance: str) -> str:
    text = text.replace("<host>", instance).replace("<model>", "warm")
    for k, v in PLACEHOLDERS.items():
        text = re.sub(rf'(?<=")({k})(?=")', v, text)  # tenant="T"
    return text


def test_shipped_alerts_fire_and_panels_answer_on_a_real_prometheus(tmp_path, exported):
    work = tmp_path
    with cluster(work) as (redis, hostds, router, keys, env):
        rules = work / "rules.yaml"
        rules.write_text(compressed_rules())
        jobs = {"mmhost-router": [f"127.0.0.1:{router.metrics_port}"],
                "mmhost-hostd": [f"127.0.0.1:{h.metrics_port}" for h in hostds]}
        prom = Prometheus(work, jobs, rules)
        watch = AlertWatch(prom)
        logs = lambda: prom.log() + router.log()[-1500:]  # noqa: E731
        try:
            # -- traffic: shed storm, load-failure burst, wrong keys; hostd 0's disk budget is past its disk
            traffic = Traffic(router, keys, hostds[1])
            try:
                watch.until_firing({"MmhostTenantShedding", "MmhostSheddingHigh", "MmhostModelLoadFailures",
                                    "MmhostModelLoadFailureRate", "MmhostUnauthenticatedSpike",
                                    "MmhostTenantLatencySLO", "MmhostDiskTierFull", "MmhostLoadsRefusedForMemory"},
                                   60, logs)
                # alerts with a `for` of 5 s or more were seen pending before firing
                for name in ("MmhostTenantShedding", "MmhostSheddingHigh", "MmhostModelLoadFailureRate",
                             "MmhostUnauthenticatedSpike", "MmhostTenantLatencySLO", "MmhostDiskTierFull"):
                    assert "pending" in watch.seen[name], (name, watch.seen[name])
                shed = {a["labels"]["tenant"] for a in prom.alerts()
                        if a["labels"]["alertname"] == "MmhostTenantShedding"}
                assert "greedy" in shed and "acme" not in shed, shed
                disk = {a["labels"]["instance"] for a in prom.alerts()
                        if a["labels"]["alertname"] == "MmhostDiskTierFull"}
                assert disk == {f"127.0.0.1:{hostds[0].metrics_port}"}, disk
                refused = {(a["labels"]["instance"], a["labels"]["model"]) for a in prom.alerts()
                           if a["labels"]["alertname"] == "MmhostLoadsRefusedForMemory"}
                assert refused == {(f"127.0.0.1:{hostds[1].metrics_port}", "big")}, refused

                # -- the runbooks' triage tells a tenant over quota from a broken model by the reason label
                def shed(job: str) -> dict[str, set[str]]:
                    out: dict[str, set[str]] = {}
                    for x in prom.query(f'sum by (tenant, reason) (rate(mmhost_requests_shed_total{{job="{job}"}}[1m]))'):
                        out.setdefault(x["metric"]["tenant"], set()).add(x["metric"]["reason"])
                    return out
                at_router, at_hosts = shed("mmhost-router"), shed("mmhost-hostd")
                assert at_router.get("greedy") == {"quota_rate"} and "globex" not in at_router, at_router
                assert at_hosts.get("globex", set()) <= {"integrity", "load_failed"} and at_hosts.get("globex"), at_hosts
                assert "greedy" not in at_hosts and "acme" not in at_hosts and "acme" not in at_router
                failing = prom.query('sum by (tenant, model) (increase(mmhost_model_loads_total{result="failure"}[1m]))')
                assert {(x["metric"]["tenant"], x["metric"]["model"]) for x in failing} == {("globex", b) for b in BROKEN}

                # -- every dashboard query answers, or needs a condition named in NEEDS_CONDITION
                empty = []
                for title, expr in _targets():
                    if not prom.query(grafana_to_promql(expr)) and not any(k in expr for k in NEEDS_CONDITION):
                        empty.append((title, expr))
                assert not empty, f"panels without data: {empty}"
                ratio = prom.query(grafana_to_promql(next(e for t, e in _targets() if "Shed ratio" in t)))
                # at most 100%, give or take rate()'s extrapolation of two targets' counters scraped at different
                # moments (globex's requests are all refused: 100% reads as 95-105%)
                assert ratio and all(0 <= float(s["value"][1]) <= 1.15 for s in ratio), ratio
                # the ratio it replaced, router + hostd sheds over hostd-only requests, reads several times 100%
                # for the tenant whose refusals happen at the router
                old = prom.query("sum by (tenant) (rate(mmhost_requests_shed_total[5m])) / "
                                 "sum by (tenant) (rate(mmhost_requests_total[5m]))")
                assert float(next(x for x in old if x["metric"]["tenant"] == "greedy")["value"][1]) > 2, old

                # -- every PromQL query of the runbooks evaluates on this Prometheus
                instance = f"127.0.0.1:{hostds[1].metrics_port}"
                queries = runbook_queries(exported)
                assert len(queries) >= 30, queries
                for page, q in queries:
                    try:
                        prom.query(_substitute(q, instance))
                    except AssertionError as e:
                        pytest.fail(f"{page}: `{q}` does not evaluate: {e}")
            finally:
                traffic.stop()

            # -- every mmhost command line of the runbooks runs against this cluster
            commands = runbook_commands()
            assert {"tenant set-limits", "catalog set-policy", "top --once"} <= {
                " ".join(c.split()[1:3]) for _, c in commands}, commands
            # TenantRecovery.md's names: $R/$S the cluster's Redis and store, $S2/$R2 another store and index
            (work / "store2").mkdir()
            files = {"$R": redis.url, "$S": env["MMHOST_STORE"], "$R2": redis.url.rsplit("/", 1)[0] + "/1",
                     "$S2": str(work / "store2"), "old.json": str(work / "old.json"), "FILE": str(work / "export.json")}
            ran = set()
            for _page, c in commands:
                if any(c.startswith(k) for k in NOT_RUN) or c in ran:
                    continue
                args = [files.get(a, PLACEHOLDERS.get(a, a)) for a in shlex.split(c)[1:]]
                out = cli(*args, env=env)
                ran.add(c)
                if args[0] == "top":
                    assert all(h.addr.rsplit(":", 1)[1] in out for h in hostds), out
            assert len(ran) >= 20, ran
            assert {"globex", "greedy"} <= set(cli("tenant", "list", "--redis", files["$R2"], env=env).split()), \
                "TenantRecovery's import into another index did not carry the tenants"

            # -- a host killed
            t = time.time()
            hostds[1].stop(signal.SIGKILL)
            watch.until_firing({"MmhostHostDown"}, 30, logs, after=t)
            # -- Redis paused: the router's reads of the host view fail
            t = time.time()
            os.kill(redis.proc.pid, signal.SIGSTOP)
            try:
                watch.until_firing({"MmhostRedisUnreachable"}, 30, logs, after=t)
            finally:
                os.kill(redis.proc.pid, signal.SIGCONT)
            # -- the last host killed: no host is eligible
            t = time.time()
            hostds[0].stop(signal.SIGKILL)
            watch.until_firing({"MmhostNoEligibleHost"}, 30, logs, after=t)
            # -- the router killed
            t = time.time()
            router.stop(signal.SIGKILL)
            watch.until_firing({"MmhostRouterDown"}, 30, logs, after=t)
        finally:
            prom.stop()
