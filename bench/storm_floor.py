"""What a byte storm costs a calm tenant with no mmhost code in the way: the floor under bench/storms.py's
ratio on this machine. The same calm client (one small ModelInfer every 20 ms, in a process of its own) and
the same storm bodies, sent by as many clients at once as the shipped byte budget admits for one tenant
(a quarter of the router's 256 MiB: 8 x 8 MB, 1 x 60 MB), against:

- `sink`: a grpc.aio server with no logic, reading each body as the router does (stream-unary,
  context.read()) and answering a fixed response: what any one-loop grpc.aio process pays to take the bytes;
- `nginx -> sink`: nginx `grpc_pass` (a C proxy, bench/nginx.py) in front of that sink;
- `sink, storm on its own loop`: the sink with a second server on a second port, served by an event loop in a
  thread of its own, the storm sent there: what keeping large bodies off the small calls' loop gives;
- `grpc.aio pass-through -> sink`: bench/passthrough.py (a Python proxy with no logic, reading bodies in the
  handler as the router does) in front of the sink: the floor of any grpc.aio proxy hop.

Then bench/storms.py's router + hostd under the full storm (64 and 16 clients), in the same run.

    python -m bench.storm_floor [--seconds 5] [--no-router] [--no-nginx]
    python -m bench.storm_floor sink LISTEN [STORM_LISTEN]      (the sink itself)"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import grpc
from grpc import aio

from bench._common import free_port, stop
from bench._tenants import Outcomes
from bench.storms import BIG, MiB, ROWS, _request, calm_elsewhere, calm_thread, run_storms, storm
from ground.units import parse_bytes
from ground.wire import SERVICE
from protos import grpc_service_pb2 as pb

ROUTER_TENANT_BUDGET = parse_bytes("256MiB") // 4  # the shipped router budget, a tenant's quarter of it
ANSWER = pb.ModelInferResponse(model_name="fast", model_version="1").SerializeToString()


def _handler() -> grpc.GenericRpcHandler:
    async def infer(request_iterator, context) -> bytes:
        await context.read()
        return ANSWER
    return grpc.method_handlers_generic_handler(SERVICE, {"ModelInfer": grpc.stream_unary_rpc_method_handler(infer)})


async def _serve(listen: str) -> None:
    server = aio.server(options=BIG)
    server.add_generic_rpc_handlers((_handler(),))
    server.add_insecure_port(listen)
    await server.start()
    await server.wait_for_termination()


def sink(listen: str, storm_listen: str | None) -> None:
    """Serve `listen` on the main thread's loop and, when given, `storm_listen` on a second loop in a thread."""
    if storm_listen:
        threading.Thread(target=lambda: asyncio.run(_serve(storm_listen)), daemon=True).start()
    asyncio.run(_serve(listen))


def _wait_serving(addr: str, timeout: float = 30) -> None:
    """Until `addr` accepts a connection (bench/_common.wait_serving asks grpc.health, which the sink has not)."""
    with grpc.insecure_channel(addr) as ch:
        grpc.channel_ready_future(ch).result(timeout=timeout)


def measure(calm_addr: str, storm_addr: str, body: bytes, concurrency: int, seconds: float) -> tuple[Outcomes, Outcomes, int]:
    """The calm client's outcomes alone, then during the storm, and how many storm requests were answered."""
    alone: list[Outcomes] = []
    calm_thread(calm_addr, (), seconds, alone).join(seconds + 30)
    p, q = calm_elsewhere(calm_addr, (), seconds + 0.5)
    codes, _, _ = asyncio.run(storm(storm_addr, (), body, concurrency, seconds))
    during = q.get(timeout=120)
    p.join(30)
    return alone[0], during, codes.get("OK", 0)


def floors(mib: int, seconds: float, nginx: bool) -> list[tuple[str, Outcomes, Outcomes, int]]:
    body = _request("wide", mib * MiB // (4 * ROWS))
    concurrency = max(1, ROUTER_TENANT_BUDGET // len(body))
    out = []
    with tempfile.TemporaryDirectory() as d:
        port, storm_port = free_port(), free_port()
        addr, storm_addr = f"127.0.0.1:{port}", f"127.0.0.1:{storm_port}"
        procs = [subprocess.Popen([sys.executable, "-m", "bench.storm_floor", "sink", addr, storm_addr])]
        try:
            _wait_serving(addr)
            _wait_serving(storm_addr)
            out.append(("sink", *measure(addr, addr, body, concurrency, seconds)))
            if nginx:
                from bench.nginx import start_nginx
                front = f"127.0.0.1:{free_port()}"
                procs.append(start_nginx(front, addr, Path(d) / "nginx"))
                _wait_serving(front)
                out.append(("nginx -> sink", *measure(front, front, body, concurrency, seconds)))
            out.append(("sink, storm on its own loop", *measure(addr, storm_addr, body, concurrency, seconds)))
            proxy = f"127.0.0.1:{free_port()}"
            procs.append(subprocess.Popen([sys.executable, "-m", "bench.passthrough", proxy, addr, "--read-in-handler"]))
            _wait_serving(proxy)
            out.append(("grpc.aio pass-through -> sink", *measure(proxy, proxy, body, concurrency, seconds)))
        finally:
            for p in procs:
                stop(p)  # SIGTERM: nginx's master takes its worker down with it (SIGKILL would leave it)
    return [(f"{concurrency} x {mib} MB storm, {name}", *rest) for name, *rest in out]


def main() -> None:
    if sys.argv[1:2] == ["sink"]:
        sink(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--no-router", action="store_true", help="leave out bench/storms.py's router + hostd")
    ap.add_argument("--no-nginx", action="store_true")
    a = ap.parse_args()
    rows: list[tuple[str, float, float, str]] = []
    for mib in (8, 60):
        for name, alone, during, ok in floors(mib, a.seconds, not a.no_nginx):
            rows.append((name, alone.pct(99), during.pct(99), f"{ok} answered, calm refused {during.refused}"))
            print(f"  {name}: calm p99 alone {alone.pct(99):.1f} ms, during {during.pct(99):.1f} ms", flush=True)
    if not a.no_router:
        for s in run_storms([(64, 8), (16, 60)], a.seconds):
            rows.append((f"{s.name}, router + hostd", s.calm_alone.pct(99), s.calm_storm.pct(99),
                         f"{s.codes.get('OK', 0)} answered, bad answers {s.bad}"))
    print(f"\n{'path':52s} {'alone p99':>10s} {'during p99':>11s} {'ratio':>7s}  (target <= 2)")
    for name, alone_ms, during_ms, what in rows:
        print(f"{name:52s} {alone_ms:8.1f}ms {during_ms:9.1f}ms {during_ms / alone_ms:6.1f}x  {what}")


if __name__ == "__main__":
    main()
