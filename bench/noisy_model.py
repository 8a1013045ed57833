"""Noisy model: a light model called at concurrency 1, alone and then beside a ~50 MB model hammered at
concurrency 32 from another client process, on one hostd, in one run; then the same through the router
with an unlimited noisy tenant, and through the router with its fast lane (fast_lane=haproxy).

    .venv/bin/python -m bench.noisy_model [--seconds 7] [--hostd-arg=--execution-slots=2 ...]

Models: light = ONNX MLP 64-256-8; noisy = ONNX MLP 256-3500-3500-10 (the reference model), batches of up
to 32. Phases (each `--seconds` long, one after the other): light alone; noisy alone; light beside the noisy
model of its own tenant; light beside the noisy model of another tenant; the light model on a plain server
process of its own (bench/plain_server.py) alone and beside the noisy model on hostd (the cores' floor;
--no-floor skips it); with --same-process S, the light model on a loop of its own inside a second hostd's
process (bench/hostd_twin.py); through the router: light alone, noisy alone, light beside the unlimited noisy
tenant; with --passthrough, light alone, noisy alone and light beside noisy (one tenant: no metadata passes)
through bench/passthrough.py, a grpc.aio proxy with no logic (the floor of any single-loop Python proxy);
with --groups, the same again with both noisy models on a second hostd of host group "bulk" and the
light model on the first (router/host_groups.py): direct, through the router, and through its fast lane.

--no-direct and --no-python-lane leave those phases out (an A/B of the fast lane alone, say); --noisy-direct adds
a fast-lane phase with the noisy tenant calling hostd directly, so HAProxy carries the light calls alone: the
difference from the phase before it is what HAProxy's handling of the noisy calls costs the light model.
The fast-lane phases end with 'mixed lanes' (--no-mixed skips them): the light model of a tenant with quotas,
which the fast lane leaves to the router's Python lane, alone and beside the unlimited noisy tenant, which
the fast lane carries: the router's loop then takes in none of the noisy calls. Then, for each N of
--lane-workers (default 0,1), the router with its fast lane and N Python-lane workers (router/lane_workers.py):
the light tenant with quotas beside a noisy tenant with quotas, both on the Python lane ('one Python loop' for
N = 0, where both share the router's loop; with N >= 1 HAProxy sends each to a router process of its own).

Printed: the light model's p50/p99 and requests per phase, the bound 'alone + 1.5 x the noisy model's batch
compute time' (the batch time measured by hostd while the noisy model ran alone), the noisy model's
throughput kept against running alone, errors, where the light model's time went inside hostd (mean
queue and compute time per request, from ModelStatistics), and the cores each process used in each phase
(the light client, hostd, the noisy client, the router and its HAProxy): whether the box was saturated, and
by whom."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from bench._common import ROOT, closed_loop, cpu_s, free_port, start_hostd, start_plain, stop, wait_model_ready, wait_serving

NOISY_DIMS = (256, 3500, 3500, 10)
LIGHT_DIMS = (64, 256, 8)
TENANT_HEADER = "mmhost-tenant"


def build_store(root: Path, work: Path) -> None:
    from catalog.publish import publish_version
    from catalog.repository import ModelRepository
    from mmhost.demo_models import build_onnx_mlp, onnx_manifest
    from storage_adapters.local import LocalStorage

    repo = ModelRepository(LocalStorage(root))
    build_onnx_mlp(work / "noisy.onnx", NOISY_DIMS)
    build_onnx_mlp(work / "light.onnx", LIGHT_DIMS)
    for tenant, model, f in (("acme", "light", "light"), ("acme", "noisy", "noisy"), ("other", "noisy", "noisy"),
                             ("metered", "light", "light"), ("bulk", "noisy", "noisy")):
        publish_version(repo, onnx_manifest(tenant, model, "1", work / f"{f}.onnx", "model.onnx"),
                        {"model.onnx": work / f"{f}.onnx"})


def _x(dims: tuple[int, ...]) -> np.ndarray:
    return np.random.default_rng(0).random((1, dims[0]), dtype=np.float32)


def client_main(addr: str, model: str, concurrency: int, seconds: float, headers: str) -> None:
    """The noisy client, in its own process: a closed loop, its result as one JSON line."""
    dims = NOISY_DIMS if model == "noisy" else LIGHT_DIMS
    r = asyncio.run(closed_loop(addr, model, "input", _x(dims), concurrency, seconds, warmup_s=0.5,
                                headers=json.loads(headers)))
    print(json.dumps(r), flush=True)


NICE: list[str] = []  # --nice-noisy: the noisy client at a lower CPU priority (it stands for remote callers)


def start_noisy(addr: str, seconds: float, headers: dict) -> subprocess.Popen:
    return subprocess.Popen(
        [*NICE, sys.executable, "-m", "bench.noisy_model", "--client", addr, "noisy", "32", str(seconds), json.dumps(headers)],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )


def noisy_result(p: subprocess.Popen) -> dict:
    out, _ = p.communicate(timeout=300)
    return json.loads(out.strip().splitlines()[-1])


@dataclass
class Stats:
    """One model's ModelStatistics totals (hostd's own accounting)."""

    requests: int = 0
    batches: int = 0
    queue_ns: int = 0
    infer_ns: int = 0

    def minus(self, o: Stats) -> Stats:
        return Stats(self.requests - o.requests, self.batches - o.batches, self.queue_ns - o.queue_ns,
                     self.infer_ns - o.infer_ns)

    @property
    def queue_ms(self) -> float:
        return self.queue_ns / max(1, self.requests) / 1e6

    @property
    def batch_ms(self) -> float:
        return self.infer_ns / max(1, self.batches) / 1e6


def stats(addr: str, model: str, tenant: str) -> Stats:
    import tritonclient.grpc as g

    c = g.InferenceServerClient(addr)
    try:
        s = c.get_inference_statistics(model, headers={TENANT_HEADER: tenant}, as_json=True)["model_stats"][0]
    finally:
        c.close()
    i = s.get("inference_stats", {})

    def ns(k: str) -> int:
        return int(i.get(k, {}).get("ns", 0))

    return Stats(int(i.get("success", {}).get("count", 0)), int(s.get("execution_count", 0)), ns("queue"),
                 ns("compute_infer"))


def loop_lag(metrics_port: int) -> dict[float, float]:
    """hostd's mmhost_event_loop_lag_seconds histogram: cumulative count per bucket bound."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
    return {float(x.labels["le"]): x.value for f in text_string_to_metric_families(text)
            for x in f.samples if x.name == "mmhost_event_loop_lag_seconds_bucket"}


def lag_quantile(before: dict[float, float], after: dict[float, float], q: float = 0.99) -> float:
    """The q-quantile (ms) of the lag samples taken between two reads (sim/calibrate.py's bucket quantile)."""
    from sim.calibrate import quantile_from_buckets

    return 1000 * quantile_from_buckets({le: c - before.get(le, 0.0) for le, c in after.items()}, q)


async def _live_loop(addr: str, seconds: float) -> dict:
    """ServerLive at concurrency 1: no model, no slot, no batch; only the event loop (and the cores)."""
    import tritonclient.grpc.aio as ga

    c = ga.InferenceServerClient(addr)
    lat: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        await c.is_server_live()
        lat.append(time.perf_counter() - t0)
    await c.close()
    a = np.array(lat) * 1000
    return {"p50": float(np.percentile(a, 50)), "p99": float(np.percentile(a, 99)), "n": len(a)}


def live_probe(addr: str, seconds: float, noisy_h: dict | None) -> dict:
    """hostd's own answer time, alone or beside the noisy model: where a light request's time goes when
    its queue and run inside hostd stay short (the loop answers every model's requests)."""
    p = start_noisy(addr, seconds + 1.0, noisy_h) if noisy_h is not None else None
    if p is not None:
        time.sleep(1.0)
    r = asyncio.run(_live_loop(addr, seconds))
    if p is not None:
        noisy_result(p)
    return r


def _cpu_s(pid: int) -> float:
    """bench/_common.cpu_s, 0 once the process is gone."""
    import psutil

    try:
        return cpu_s(pid)
    except psutil.Error:
        return 0.0


class CpuWindow:
    """Cores each named process used between `__init__` and `stop`: where a phase's CPU went, the light
    client (this process), hostd, the noisy client, the router and its HAProxy."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = dict(pids)
        self.t0 = time.perf_counter()
        self.c0 = {k: _cpu_s(v) for k, v in self.pids.items()}

    def stop(self) -> dict[str, float]:
        wall = time.perf_counter() - self.t0
        return {k: (_cpu_s(v) - self.c0[k]) / wall for k, v in self.pids.items()}


def router_children(router_pid: int) -> list[tuple[str, int]]:
    """The router's HAProxy ("haproxy") and Python-lane workers ("worker"), as (kind, pid)."""
    import psutil

    out = []
    for c in psutil.Process(router_pid).children(recursive=False):
        if c.name().startswith("haproxy"):
            out.append(("haproxy", c.pid))
        elif "router.lane_workers" in " ".join(c.cmdline()):
            out.append(("worker", c.pid))
    return out


def haproxy_pid(router_pid: int) -> int | None:
    """The fast lane's HAProxy: the router's child process of that name."""
    import psutil

    for c in psutil.Process(router_pid).children(recursive=True):
        if c.name().startswith("haproxy"):
            return c.pid
    return None


def light(addr: str, seconds: float, headers: dict) -> dict:
    return asyncio.run(closed_loop(addr, "light", "input", _x(LIGHT_DIMS), 1, seconds, warmup_s=0.5, headers=headers))


def start_router(work: Path, host: str, tenants: Path, store: Path, *extra: str,
                 env: dict | None = None) -> tuple[subprocess.Popen, str]:
    """bench/noisy_neighbor.py's router, started here: that module imports our protos, which clash with
    tritonclient's in one process. `host`: one address or several, comma-separated."""
    port = free_port()
    addr = f"127.0.0.1:{port}"
    log = open(work / f"router-{port}.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mmhost.cli", "router", "--listen", addr, "--hosts", host, "--tenants", str(tenants),
         "--store", str(store), "--metrics-port", "0", "--refresh-interval", "0.2", "--log-level", "WARNING", *extra],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
        env={**os.environ, "MMHOST_ROUTER_PLAINTEXT": "true", **(env or {})},
    )
    wait_serving(addr, proc)
    return proc, addr


def run(seconds: float, hostd_args: list[str], via_router: bool = True,
        fast_lane: bool = True, floor: bool = True, twin: tuple[float, ...] = (),
        groups: bool = False, passthrough: bool = False, direct_lane: bool = True,
        python_lane: bool = True, noisy_direct: bool = False,
        mixed: bool = True, workers: tuple[int, ...] = ()) -> list[tuple[str, dict, Stats | None, dict | None]]:
    """Rows: (phase, light client result, light's hostd stats over the phase, noisy client result).
    direct_lane / python_lane False: skip the direct phases / the phases through the router's Python lane;
    noisy_direct: also the light model through the fast lane while the noisy tenant calls hostd directly;
    mixed: also, through the router with its fast lane, the light model of a tenant with quotas (the Python lane)
    beside the unlimited noisy tenant (the fast lane); workers: for each n, through the router with its fast lane
    and n Python-lane workers (0: the router's loop alone), the light model of a tenant with quotas beside a
    noisy tenant with quotas, both on the Python lane."""
    from router.tenants import FileTenants

    rows: list[tuple[str, dict, Stats | None, dict | None]] = []
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        store = work / "store"
        build_store(store, work)
        tenants = work / "tenants.json"
        reg = FileTenants(tenants)
        keys = {t: reg.create(t, "unlimited") for t in ("acme", "other")}
        # a tenant with quotas (far above what its light client asks): the router's Python lane serves it
        keys["metered"] = reg.create("metered", "standard", {"rate": 100000, "burst": 100000, "max_concurrency": 64})
        # a noisy tenant with quotas as generous: the fast lane leaves it to the Python lane too
        keys["bulk"] = reg.create("bulk", "standard", {"rate": 100000, "burst": 100000, "max_concurrency": 64})
        mport = free_port()
        hostd, host = start_hostd(str(store), work, "--tenant-limits", str(tenants), "--default-tenant", "acme",
                                  "--metrics-port", str(mport), *hostd_args)
        router = None
        procs: dict[str, int] = {}  # the router (and its HAProxy) in use, for CpuWindow
        try:
            direct = {t: {TENANT_HEADER: t} for t in ("acme", "other", "metered", "bulk")}
            for t, m in (("acme", "light"), ("acme", "noisy"), ("other", "noisy"), ("metered", "light"),
                         ("bulk", "noisy")):  # load all, warm up
                for _ in range(3):
                    asyncio.run(closed_loop(host, m, "input", _x(NOISY_DIMS if m == "noisy" else LIGHT_DIMS), 4,
                                            0.3, warmup_s=0.0, headers=direct[t]))

            def phase(name: str, addr: str, light_h: dict, noisy_h: dict | None, noisy_addr: str | None = None,
                      in_hostd: bool = True, lag_port: int | None = None, light_tenant: str = "acme") -> None:
                # hostd's statistics: its light model only
                before = stats(host, "light", light_tenant) if in_hostd else None
                p = start_noisy(noisy_addr or addr, seconds + 1.0, noisy_h) if noisy_h is not None else None
                if p is not None:
                    time.sleep(1.0)  # the noisy client is started and at full load
                lag0 = loop_lag(lag_port or mport)
                # cores used over the light phase by the light client (this process), the first hostd, the noisy
                # client and the router and HAProxy in use
                cpu = CpuWindow({"client": os.getpid(), "hostd": hostd.pid, **procs,
                                 **({"noisy": p.pid} if p is not None else {})})
                r = light(addr, seconds, light_h)
                r["cpu"] = cpu.stop()
                r["loop_lag_p99"] = lag_quantile(lag0, loop_lag(lag_port or mport))
                nz = noisy_result(p) if p is not None else None
                rows.append((name, r, stats(host, "light", light_tenant).minus(before) if before is not None else None,
                             nz))

            def noisy_alone(name: str, addr: str, h: dict, tenant: str, on: str | None = None) -> None:
                before = stats(on or host, "noisy", tenant)
                p = start_noisy(addr, seconds, h)
                time.sleep(1.5)  # its start-up and warm-up
                cpu = CpuWindow({"hostd": hostd.pid, **procs, "noisy": p.pid})
                time.sleep(max(0.5, seconds - 1.0))  # inside its measured seconds
                c = cpu.stop()
                nz = noisy_result(p)
                nz["cpu"] = c
                rows.append((name, {}, stats(on or host, "noisy", tenant).minus(before), nz))

            if direct_lane:
                direct_phases(host, direct, phase, noisy_alone)
                live = (live_probe(host, min(seconds, 3.0), None), live_probe(host, min(seconds, 3.0), direct["other"]))
                print(f"hostd ServerLive p50/p99 ms: alone {live[0]['p50']:.2f}/{live[0]['p99']:.2f}, beside the "
                      f"noisy model {live[1]['p50']:.2f}/{live[1]['p99']:.2f} (the event loop and the cores, no model)",
                      flush=True)
            if floor:  # the light model in a process of its own: what the cores alone allow it beside the noisy load
                # in this session, as hostd is: a session of its own would be a scheduling group of its own
                plain = start_plain(work / "light.onnx", "light", work, new_session=False)
                procs["plain"] = plain[0].pid
                try:
                    light(plain[1], 1.0, {})
                    phase("own process: light alone", plain[1], {}, None, in_hostd=False)
                    noisy_alone("own process: noisy alone", host, direct["other"], "other")
                    phase("own process: beside noisy", plain[1], {}, direct["other"], noisy_addr=host, in_hostd=False)
                finally:
                    procs.pop("plain", None)
                    stop(plain[0])
            for swi in twin:  # a loop of its own inside hostd's process (bench/hostd_twin.py)
                tport, tm = free_port(), free_port()
                taddr = f"127.0.0.1:{tport}"
                env = {"BENCH_SWITCH_INTERVAL_S": str(swi)} if swi else {}
                twin_hostd, thost = start_hostd(str(store), work, "--tenant-limits", str(tenants), "--default-tenant",
                                                "acme", "--metrics-port", str(tm), *hostd_args, env=env,
                                                launcher=("-m", "bench.hostd_twin", taddr, str(work / "light.onnx"),
                                                          "light"))
                try:
                    wait_model_ready(taddr, "light", twin_hostd, work / f"hostd-{thost.rsplit(':', 1)[1]}.log", timeout=60)
                    for _ in range(3):
                        asyncio.run(closed_loop(thost, "noisy", "input", _x(NOISY_DIMS), 4, 0.3, warmup_s=0.0,
                                                headers=direct["other"]))
                    light(taddr, 1.0, {})
                    tag = f"same process{f' swi {swi * 1000:g} ms' if swi else ''}: "
                    phase(tag + "light alone", taddr, {}, None, in_hostd=False, lag_port=tm)
                    noisy_alone(tag + "noisy alone", thost, direct["other"], "other", on=thost)
                    phase(tag + "beside noisy", taddr, {}, direct["other"], noisy_addr=thost, in_hostd=False, lag_port=tm)
                finally:
                    stop(twin_hostd)
            if passthrough:  # a Python proxy with no logic, one loop for both clients: the floor of the router's lane
                paddr = f"127.0.0.1:{free_port()}"
                passthru = subprocess.Popen([sys.executable, "-m", "bench.passthrough", paddr, host], cwd=ROOT)
                try:
                    wait_serving(paddr, passthru)
                    light(paddr, 1.0, {})  # no metadata passes: both are hostd's default tenant, acme
                    phase("pass-through: light alone", paddr, {}, None)
                    noisy_alone("pass-through: noisy alone", paddr, {}, "acme")
                    phase("pass-through: beside noisy, same tenant", paddr, {}, {})
                finally:
                    stop(passthru)
            via = {t: {"authorization": f"Bearer {k}"} for t, k in keys.items()}
            if groups:  # host groups: the noisy models on a second hostd of group "bulk" (router/host_groups.py)
                group_phases(work, store, tenants, host, hostd_args, direct, via, phase, noisy_alone,
                             via_router, fast_lane)
            if not via_router:
                return rows
            if python_lane:
                router, raddr = start_router(work, host, tenants, store)
                procs["router"] = router.pid
                light(raddr, 1.0, via["acme"])  # warm-up through the router
                phase("router: light alone", raddr, via["acme"], None)
                noisy_alone("router: noisy alone", raddr, via["other"], "other")
                phase("router: beside unlimited noisy tenant", raddr, via["acme"], via["other"])
                stop(router)
                router = None
                procs.clear()
            if fast_lane:  # the router with its fast lane: HAProxy sends both tenants' calls straight to hostd
                router, faddr = start_router(work, host, tenants, store, "--fast-lane", "haproxy")
                procs["router"] = router.pid
                hp = haproxy_pid(router.pid)
                if hp is not None:
                    procs["haproxy"] = hp
                light(faddr, 1.5, via["acme"])  # warm-up; the models are READY, so routed from the first sync
                phase("fast lane: light alone", faddr, via["acme"], None)
                noisy_alone("fast lane: noisy alone", faddr, via["other"], "other")
                phase("fast lane: beside unlimited noisy tenant", faddr, via["acme"], via["other"])
                if noisy_direct:  # HAProxy carries the light calls only: what its own share of the noisy load costs
                    phase("fast lane: beside noisy sent to hostd", faddr, via["acme"], direct["other"], noisy_addr=host)
                if mixed:  # a tenant with quotas takes the Python lane, the unlimited noisy one the fast lane
                    light(faddr, 1.0, via["metered"])  # warm-up through the router's Python lane
                    phase("mixed lanes: light alone", faddr, via["metered"], None, light_tenant="metered")
                    noisy_alone("mixed lanes: noisy alone", faddr, via["other"], "other")
                    phase("mixed lanes: beside unlimited noisy tenant", faddr, via["metered"], via["other"],
                          light_tenant="metered")
                stop(router)
                router = None
                procs.clear()
            for n in workers:  # both tenants with quotas (Python lane): one loop (0) against n more processes
                router, waddr = start_router(work, host, tenants, store, "--fast-lane", "haproxy",
                                             "--fast-lane-workers", str(n))
                procs["router"] = router.pid
                for kind, pid in router_children(router.pid):  # haproxy, worker1, worker2, ...
                    procs[kind if kind == "haproxy" else f"worker{sum(k.startswith('worker') for k in procs) + 1}"] = pid
                tag = f"lane workers {n}: " if n else "one Python loop: "
                light(waddr, 1.0, via["metered"])  # warm-up through the Python lane
                phase(tag + "light alone", waddr, via["metered"], None, light_tenant="metered")
                noisy_alone(tag + "noisy alone", waddr, via["bulk"], "bulk")
                phase(tag + "beside noisy tenant with quotas", waddr, via["metered"], via["bulk"],
                      light_tenant="metered")
                stop(router)
                router = None
                procs.clear()
        finally:
            if router is not None:
                stop(router)
            stop(hostd)
    return rows


def direct_phases(host: str, direct: dict, phase, noisy_alone) -> None:
    phase("light alone", host, direct["acme"], None)
    noisy_alone("noisy alone", host, direct["acme"], "acme")
    phase("beside noisy, same tenant", host, direct["acme"], direct["acme"])
    phase("beside noisy, other tenant", host, direct["acme"], direct["other"])


GROUPS = {"other": "bulk", "acme/noisy": "bulk"}  # both noisy models to the bulk hostd; acme's light one shared


def group_phases(work: Path, store: Path, tenants: Path, host: str, hostd_args: list[str], direct: dict, via: dict,
                 phase, noisy_alone, via_router: bool, fast_lane: bool) -> None:
    """The light model on the first hostd (the shared pool), both noisy models on a hostd of group "bulk" on the
    same cores: direct, through the router with host_groups GROUPS, and through its fast lane."""
    bport = free_port()
    bulk, bhost = start_hostd(str(store), work, "--tenant-limits", str(tenants), "--default-tenant", "acme",
                              "--metrics-port", str(bport), "--host-group", "bulk", *hostd_args)
    router = None
    try:
        for t in ("acme", "other"):
            for _ in range(3):
                asyncio.run(closed_loop(bhost, "noisy", "input", _x(NOISY_DIMS), 4, 0.3, warmup_s=0.0,
                                        headers=direct[t]))
        phase("groups: light alone", host, direct["acme"], None)
        noisy_alone("groups: noisy alone", bhost, direct["other"], "other", on=bhost)
        phase("groups: beside noisy, same tenant", host, direct["acme"], direct["acme"], noisy_addr=bhost)
        phase("groups: beside noisy, other tenant", host, direct["acme"], direct["other"], noisy_addr=bhost)
        lanes = ([("groups router: ", ())] if via_router else []) + \
            ([("groups fast lane: ", ("--fast-lane", "haproxy"))] if via_router and fast_lane else [])
        for tag, extra in lanes:
            router, raddr = start_router(work, f"{host},{bhost}", tenants, store, *extra,
                                         env={"MMHOST_ROUTER_HOST_GROUPS": json.dumps(GROUPS)})
            light(raddr, 1.5, via["acme"])  # warm-up; on the fast lane, READY models are routed from the first sync
            phase(tag + "light alone", raddr, via["acme"], None)
            noisy_alone(tag + "noisy alone", raddr, via["other"], "other", on=bhost)
            phase(tag + "beside noisy, same tenant", raddr, via["acme"], via["acme"])
            phase(tag + "beside unlimited noisy tenant", raddr, via["acme"], via["other"])
            stop(router)
            router = None
    finally:
        if router is not None:
            stop(router)
        stop(bulk)


def report(rows: list[tuple[str, dict, Stats | None, dict | None]]) -> bool:
    by = {name: (r, s, nz) for name, r, s, nz in rows}
    print(f"{'phase':<40}{'light p50':>10}{'p99 ms':>9}{'requests':>9}{'errors':>7}{'queue ms':>9}{'run ms':>7}{'bound ms':>9}"
          f"{'ok':>4}{'noisy rps':>10}{'kept':>7}")
    ok_all = True
    for name, r, s, nz in rows:
        if not r:  # noisy alone
            assert nz is not None and s is not None
            print(f"{name:<40}{'':>10}{'':>9}{'':>9}{nz['errors']:>7}{'':>9}{'':>7}{'':>9}{'':>4}{nz['rps']:>10.0f}{'':>7}"
                  f"   (noisy batch compute {s.batch_ms:.1f} ms, {s.requests / max(1, s.batches):.1f} requests/batch)")
            continue
        path = _path(name)
        alone, _, _ = by[path + "light alone"]
        noisy_alone = by[path + "noisy alone"]
        bound = kept = None
        ok = True
        if nz is not None:
            batch_ms = noisy_alone[1].batch_ms if noisy_alone[1] else float("nan")
            bound = alone["p99"] + 1.5 * batch_ms
            kept = nz["rps"] / noisy_alone[2]["rps"]
            ok = r["p99"] <= bound and r["errors"] == 0 and nz["errors"] == 0 and kept >= 0.85
            ok_all &= ok
        q = s.queue_ms if s is not None else float("nan")
        c = s.batch_ms if s is not None else float("nan")
        print(f"{name:<40}{r['p50']:>10.2f}{r['p99']:>9.2f}{r['n']:>9}{r['errors'] + (nz or {}).get('errors', 0):>7}"
              f"{q:>9.2f}{c:>7.2f}{(f'{bound:.1f}' if bound else ''):>9}{('yes' if ok else 'NO') if nz else '':>4}"
              f"{(format(nz['rps'], '.0f') if nz else ''):>10}{(format(kept, '.2f') if kept else ''):>7}")
    for name, r, _, nz in rows:
        if nz is not None and r and "alone" not in name:
            alone = by[_path(name) + "light alone"][0]
            print(f"  {name}: light p99 {r['p99'] / alone['p99']:.1f}x alone")
    print("hostd event-loop lag p99 during each light phase (mmhost_event_loop_lag_seconds, linear within its "
          "bucket): " + ", ".join(f"{name} {r['loop_lag_p99']:.1f} ms" for name, r, _, _ in rows if r))
    print(f"CPU by process during each phase, in cores of {os.cpu_count()} (noisy alone: over the noisy client's "
          "run; the rest: over the light phase; client = the light client; in 'groups' phases hostd is the first, "
          "which serves the light model alone)")
    for name, r, _, nz in rows:
        c = r.get("cpu") if r else (nz or {}).get("cpu")
        if c:
            print(f"  {name:<40} " + "  ".join(f"{k} {v:.2f}" for k, v in c.items()) + f"  total {sum(c.values()):.2f}")
    print("bound = light p99 alone + 1.5 x the noisy model's mean batch compute time alone (hostd's statistics); "
          "kept = noisy requests/s beside the light model / alone; queue ms, run ms = light's mean queue time and "
          "session run time in hostd")
    print("all phases within the bound, 0 errors, noisy kept >= 0.85:", "yes" if ok_all else "NO")
    return ok_all


def _path(phase: str) -> str:
    """The phases' common prefix: '' (direct), 'own process: ', 'router: ' or 'fast lane: '."""
    return phase.split(": ", 1)[0] + ": " if ": " in phase else ""


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        addr, model, conc, secs, headers = sys.argv[2:7]
        client_main(addr, model, int(conc), float(secs), headers)
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=7.0, help="length of each phase")
    ap.add_argument("--hostd-arg", action="append", default=[], help="extra hostd flag (repeat), e.g. "
                    "--hostd-arg=--execution-slots=2")
    ap.add_argument("--nice-noisy", type=int, default=0, help="run the noisy client under `nice -n N` (its CPU "
                    "use stands for remote callers', not the host's); 0 = same priority as everything else")
    ap.add_argument("--direct-only", action="store_true", help="skip the phases through the router")
    ap.add_argument("--no-floor", action="store_true", help="skip the phases with the light model on a plain "
                    "server process of its own (bench/plain_server.py) beside the noisy model on hostd")
    ap.add_argument("--same-process", action="append", type=float, default=[], metavar="SWITCH_INTERVAL_S",
                    help="phases with the light model on a loop of its own inside a second hostd's process "
                    "(bench/hostd_twin.py), the interpreter's switch interval set to this (0: Python's default); "
                    "repeat for several")
    ap.add_argument("--no-fast-lane", action="store_true", help="skip the phases through the router's fast lane "
                    "(not the --lane-workers phases)")
    ap.add_argument("--no-direct", action="store_true", help="skip the phases calling hostd directly")
    ap.add_argument("--no-python-lane", action="store_true", help="skip the phases through the router's Python lane")
    ap.add_argument("--noisy-direct", action="store_true", help="also the light model through the fast lane with "
                    "the noisy tenant calling hostd directly (HAProxy's own share of the light model's wait)")
    ap.add_argument("--no-mixed", action="store_true", help="skip the fast lane's 'mixed lanes' phases (a tenant with "
                    "quotas on the Python lane beside the unlimited noisy tenant on the fast lane)")
    ap.add_argument("--groups", action="store_true", help="also the phases with the noisy models on a second hostd of "
                    "host group 'bulk' (direct, through the router with host_groups, and its fast lane)")
    ap.add_argument("--passthrough", action="store_true", help="also the phases through bench/passthrough.py, a "
                    "grpc.aio proxy with no logic carrying both clients on one event loop, as the router does")
    ap.add_argument("--lane-workers", default="0,1", help="comma-separated: for each N, the router with its fast lane "
                    "and N Python-lane workers (0: its one loop), a light tenant with quotas beside a noisy tenant with "
                    "quotas, both on the Python lane; '' skips them")
    args = ap.parse_args()
    if args.nice_noisy:
        NICE[:] = ["nice", "-n", str(args.nice_noisy)]
    rows = run(args.seconds, args.hostd_arg, not args.direct_only, not args.no_fast_lane, not args.no_floor,
               tuple(args.same_process), args.groups, args.passthrough, not args.no_direct, not args.no_python_lane,
               args.noisy_direct, not args.no_mixed,
               tuple(int(x) for x in args.lane_workers.split(",") if x.strip()))
    print(f"noisy model: light {'-'.join(map(str, LIGHT_DIMS))} at concurrency 1 beside noisy "
          f"{'-'.join(map(str, NOISY_DIMS))} at concurrency 32 (another process), {args.seconds:g} s per phase, "
          f"one hostd {' '.join(args.hostd_arg)}")
    report(rows)


if __name__ == "__main__":
    main()
