"""The router's cost, in one run: the same model and closed-loop load (Triton asyncio clients) sent straight to a
hostd, through the router (its ModelInfer forwards on streams to the hostd, carried by the hostd's data link:
router/host_streams.py, ground/framelink.py), through the same router with its streams on gRPC ('router grpc',
hostd_data_link=false), through the same router on asyncio's own event loop instead of uvloop ('router asyncio',
event_loop=asyncio: ground/eventloop.py), through the same router with one gRPC call per forward ('router unary',
hostd_streams=0), through the router with its fast lane (fast_lane=haproxy: HAProxy in front, with the router's
auth and routes; router/fastlane.py), through nginx `grpc_pass` (a C proxy, no auth: the yardstick) and through
a grpc.aio pass-through with no logic (bench/passthrough.py: the floor of any Python gRPC proxy making a call per
forward), unary and, as
'pass+read', reading the body in a stream-unary handler as the router's ModelInfer does; and 'echo', a
grpc.aio server that answers every ModelInfer at once with an empty answer (bench/passthrough.py --echo: no
model, no upstream), the CPU per request of answering a call at all in Python. For each concurrency
level it prints throughput kept against direct, p50 added, and CPU per request of every process on the path
(from /proc, over the measured window), and the router's CPU per request against hostd's. Targets (issue #13):
kept >= 0.8x at c32, p50 added <= +0.8 ms at c1, router CPU per request <= 0.35x hostd's (small model, c16).
Embedded mode: one hostd, one router with a tenants file, no Redis.

    python -m bench.router [--seconds 4] [--levels 1,16,32] [--dims 256,3500,3500,10 | --small] [--paths A,B]"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from collections.abc import Callable

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import ROOT, closed_loop, cpu_s, free_port, start_hostd, stop, wait_serving  # noqa: E402
from bench.nginx import start_nginx  # noqa: E402
from mmhost.demo_models import build_onnx_mlp, onnx_manifest  # noqa: E402
from router.tenants import FileTenants  # noqa: E402
from storage_adapters.local import LocalStorage  # noqa: E402
from catalog.publish import publish_version  # noqa: E402
from catalog.repository import ModelRepository  # noqa: E402


def start_router(hostd: str, tenants: Path, store: Path, workdir: Path, *extra: str,
                 env: dict | None = None) -> tuple[subprocess.Popen, str]:
    addr = f"127.0.0.1:{free_port()}"
    log = open(workdir / f"router-{addr.rsplit(':', 1)[1]}.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mmhost.cli", "router", "--listen", addr, "--hosts", hostd, "--tenants", str(tenants),
         "--store", str(store), "--metrics-port", "0", "--log-level", "WARNING", *extra],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
        env={**os.environ, "MMHOST_ROUTER_PLAINTEXT": "true", **(env or {})},
    )
    return serving(proc, addr), addr


def serving(proc: subprocess.Popen, addr: str) -> subprocess.Popen:
    """`proc` once it serves at `addr`; stopped, and the error raised, when it does not (nothing left running)."""
    try:
        wait_serving(addr, proc)
    except BaseException:
        stop(proc)
        raise
    return proc


def measured(addr: str, x, c: int, seconds: float, headers: dict | None, pids: dict[str, int],
             client_kw: dict | None = None) -> dict:
    """One closed-loop point with each process's CPU seconds per request over the whole run."""
    before = {n: cpu_s(p) for n, p in pids.items()}
    r = asyncio.run(closed_loop(addr, "mlp", "input", x, c, seconds, headers=headers, client_kw=client_kw))
    # every request sent, the warm-up's too: the CPU counted them as well
    r["cpu_us"] = {n: (cpu_s(p) - before[n]) / max(r["sent"], 1) * 1e6 for n, p in pids.items()}
    return r


def model_and_tenant(t: Path, dims: tuple[int, ...], what: str) -> str:
    """Build the MLP, publish it as bench/mlp in the store under `t`, print what it is; the tenant's API key."""
    build_onnx_mlp(t / "mlp.onnx", dims)
    repo = ModelRepository(LocalStorage(t / "store"))
    publish_version(repo, onnx_manifest("bench", "mlp", "1", t / "mlp.onnx", "model.onnx"), {"model.onnx": t / "mlp.onnx"})
    key = FileTenants(t / "tenants.json").create("bench")
    print(f"model: ONNX MLP {'-'.join(map(str, dims))}, {(t / 'mlp.onnx').stat().st_size / 1e6:.1f} MB; {what}; "
          f"{os.cpu_count()} CPUs")
    return key


def load_args(levels: str) -> argparse.ArgumentParser:
    """The load and model flags of bench/router.py and bench/link_tls.py; see `levels_and_dims`."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--levels", default=levels)
    ap.add_argument("--dims", default="256,3500,3500,10", help="MLP layer sizes (the reference model by default)")
    ap.add_argument("--small", action="store_true", help="the small model (MLP 64-256-8): CPU per request of the path")
    ap.add_argument("--rounds", type=int, default=1,
                    help="rounds of every level; odd rounds measure the paths in reverse order (direct stays first)")
    return ap


def measure_rounds(a: argparse.Namespace, levels: list[int], paths: list, direct, one) -> list[tuple[int, dict]]:
    """Rows (level, {path: point}) over `a.rounds` rounds: each level's 'direct' point first (`direct(c)`), then
    every path (`one(addr, c, headers, pids)` for paths' (name, addr, headers, pids)), in order on even rounds
    and in reverse on odd ones, so that no path always runs right after direct or last; printed in `paths`' order."""
    rows = []
    for rnd in range(a.rounds):
        for c in levels:
            got = {"direct": direct(c)}
            for name, addr, headers, pids in (paths if rnd % 2 == 0 else paths[::-1]):
                got[name] = one(addr, c, headers, pids)
            rows.append((c, {"direct": got["direct"], **{name: got[name] for name, *_ in paths}}))
    return rows


def levels_and_dims(a: argparse.Namespace) -> tuple[list[int], tuple[int, ...]]:
    return [int(c) for c in a.levels.split(",")], (64, 256, 8) if a.small else tuple(int(d) for d in a.dims.split(","))


Started = tuple[list[subprocess.Popen], str, dict | None, dict[str, int]]  # processes, address, headers, pids


def path_starters(a: argparse.Namespace, t: Path, hostd: subprocess.Popen, haddr: str, dims: tuple[int, ...],
                  key: str) -> list[tuple[str, Callable[[], Started]]]:
    """Each path's name (as printed) and how to start what it needs, in the order printed."""
    headers = {"authorization": f"Bearer {key}"}

    def router(*extra: str, env: dict | None = None) -> Callable[[], Started]:
        def start() -> Started:
            proc, addr = start_router(haddr, t / "tenants.json", t / "store", t, *extra, env=env)
            return [proc], addr, headers, {"hostd": hostd.pid, "router": proc.pid}
        return start

    def fast_lane() -> Started:  # the router with its fast lane: HAProxy in front, a child of the router
        procs, addr, h, pids = router("--fast-lane", "haproxy")()
        try:
            pids["haproxy"] = psutil.Process(pids["router"]).children()[0].pid
            wait_fast_route(addr, dims, key)
        except BaseException:
            stop(procs[0])
            raise
        return procs, addr, h, pids

    def nginx() -> Started:
        addr = f"127.0.0.1:{free_port()}"
        proc = serving(start_nginx(addr, haddr, t / "nginx"), addr)
        return [proc], addr, None, {"hostd": hostd.pid, "nginx": _worker(proc.pid)}

    def passthrough(name: str, *flags: str) -> Callable[[], Started]:
        def start() -> Started:
            addr = f"127.0.0.1:{free_port()}"
            proc = serving(subprocess.Popen([sys.executable, "-m", "bench.passthrough", addr, haddr, *flags], cwd=ROOT),
                           addr)
            return [proc], addr, None, ({} if "--echo" in flags else {"hostd": hostd.pid}) | {name: proc.pid}
        return start

    starters: list[tuple[str, Callable[[], Started]]] = [
        ("router", router()),
        # the same router on asyncio's own loop (event_loop=asyncio), against uvloop's, its default
        ("router asyncio", router(env={"MMHOST_ROUTER_EVENT_LOOP": "asyncio"})),
        # the same router with its streams on gRPC (HostdData.Infer) instead of the hostd's data link
        ("router grpc", router(env={"MMHOST_ROUTER_HOSTD_DATA_LINK": "false"})),
        # the same router making one gRPC call per forward (hostd_streams=0), as before router/host_streams.py
        ("router unary", router(env={"MMHOST_ROUTER_HOSTD_STREAMS": "0"}))]
    if not a.no_fast_lane:
        starters.append(("fast lane", fast_lane))
    if not a.no_nginx:
        starters.append(("nginx", nginx))
    return starters + [
        ("passthrough", passthrough("passthrough")),
        # the same, reading the body in the handler as the router does
        ("pass+read", passthrough("pass+read", "--read-in-handler")),
        # the floor of any Python gRPC front end: answers, does nothing
        ("echo", passthrough("echo", "--echo"))]


def main() -> None:
    ap = load_args("1,16,32")
    ap.add_argument("--no-nginx", action="store_true")
    ap.add_argument("--no-fast-lane", action="store_true", help="leave out the router with fast_lane=haproxy")
    ap.add_argument("--paths", default="", help="measure only these paths (and direct), comma-separated names as "
                    "printed, e.g. 'router,router asyncio'; only their processes are started")
    a = ap.parse_args()
    levels, dims = levels_and_dims(a)
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as running:
        t = Path(tmp)
        key = model_and_tenant(t, dims, f"{a.seconds:.0f}s per point")
        hostd, haddr = start_hostd(str(t / "store"), t, "--preload", "--default-tenant", "bench")
        running.callback(stop, hostd)  # stopped last: the callbacks run in reverse
        starters = path_starters(a, t, hostd, haddr, dims, key)
        if a.paths:  # only these (and direct): more rounds of a comparison in the same time, nothing else running
            wanted = [w.strip() for w in a.paths.split(",")]
            unknown = sorted(set(wanted) - {n for n, _ in starters})
            if unknown:
                sys.exit(f"bench.router: no path {', '.join(unknown)}; the paths: {', '.join(n for n, _ in starters)}")
            starters = [s for s in starters if s[0] in wanted]
        paths: list[tuple[str, str, dict | None, dict[str, int]]] = []
        for name, start in starters:
            procs, addr, headers, pids = start()
            for p in procs:
                running.callback(stop, p)
            paths.append((name, addr, headers, pids))
        x = np.random.default_rng(0).random((1, dims[0]), dtype=np.float32)
        rows = measure_rounds(a, levels, paths, lambda c: measured(haddr, x, c, a.seconds, None, {"hostd": hostd.pid}),
                              lambda addr, c, h, pids: measured(addr, x, c, a.seconds, h, pids))
    print_table(rows)
    targets = []
    for path in ("router", "router asyncio", "router grpc", "router unary", "fast lane"):
        for c, pts in rows:
            if path not in pts:
                continue
            r, d = pts[path], pts["direct"]
            if c == 1:
                targets.append(f"c1 {path} p50 added {r['p50'] - d['p50']:+.2f} ms (target <= +0.8): "
                               f"{'holds' if r['p50'] - d['p50'] <= 0.8 else 'NOT met'}")
            if c == 32:
                k = r["rps"] / d["rps"]
                targets.append(f"c32 {path} kept {k:.2f}x (target >= 0.8x): {'holds' if k >= 0.8 else 'NOT met'}")
                if path == "router unary" and "passthrough" in pts:
                    floor = pts["passthrough"]["rps"] / d["rps"]
                    targets.append(f"c32 grpc.aio pass-through floor kept {floor:.2f}x: the router with a call per "
                                   f"forward is at {k / floor:.2f}x of what a Python proxy with no logic keeps")
            if c == 16 and a.small:  # the fast lane's cost is HAProxy's and the router's (its log reader) together
                proxy = sum(us for n, us in r["cpu_us"].items() if n != "hostd")
                ratio = proxy / r["cpu_us"]["hostd"]
                targets.append(f"c16 {path} CPU/request {ratio:.2f}x hostd's (target <= 0.35x): "
                               f"{'holds' if ratio <= 0.35 else 'NOT met'}")
    for c, pts in rows:
        if c == 16 and a.small and "echo" in pts and "router" in pts:  # against hostd's behind the router
            echo_us, hostd_us = pts["echo"]["cpu_us"]["echo"], pts["router"]["cpu_us"]["hostd"]
            targets.append(f"c16 grpc.aio echo (answers, does nothing) {echo_us:.0f} us/request = "
                           f"{echo_us / hostd_us:.2f}x hostd's behind the router: the floor of a Python gRPC front end "
                           f"against the 0.35x target")
    for line in targets:
        print(line)


def print_table(rows: list[tuple[int, dict[str, dict]]]) -> None:
    """One line per concurrency level and path: throughput and latency, kept and p50 added against 'direct',
    CPU per request of each process, and the proxy's CPU against hostd's."""
    print(f"{'conc':>4} | {'path':<12} | {'req/s':>7} {'p50 ms':>7} {'p99 ms':>7} | {'kept':>6} {'p50 +ms':>8} | "
          f"CPU us/request")
    for c, pts in rows:
        d = pts["direct"]
        for name, r in pts.items():
            kept = r["rps"] / d["rps"] if d["rps"] else float("nan")
            cpu = " ".join(f"{n}={us:.0f}" for n, us in r["cpu_us"].items())
            proxy = sum(us for n, us in r["cpu_us"].items() if n != "hostd") if len(r["cpu_us"]) > 1 else None
            vs = f" (proxy/hostd {proxy / r['cpu_us']['hostd']:.2f}x)" if proxy is not None and r["cpu_us"]["hostd"] else ""
            errs = f" errors={r['errors']}" if r["errors"] else ""
            print(f"{c:>4} | {name:<12} | {r['rps']:7.0f} {r['p50']:7.2f} {r['p99']:7.2f} | {kept:5.2f}x "
                  f"{r['p50'] - d['p50']:+8.2f} | {cpu}{vs}{errs}")


def wait_fast_route(addr: str, dims, key: str) -> None:
    """One call, then two of the router's refreshes (0.5 s each): the model is READY (hostd preloads it), so the
    router's next fast-lane sync routes it."""
    import tritonclient.grpc as gc

    i = gc.InferInput("input", [1, dims[0]], "FP32")
    i.set_data_from_numpy(np.zeros((1, dims[0]), np.float32))
    gc.InferenceServerClient(addr).infer("mlp", [i], headers={"authorization": f"Bearer {key}"})
    time.sleep(1.0)


def _worker(master: int) -> int:
    """nginx's (single) worker process: where the proxying CPU goes."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        kids = psutil.Process(master).children()
        if kids:
            return kids[0].pid
        time.sleep(0.05)
    return master


if __name__ == "__main__":
    main()
