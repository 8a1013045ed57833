"""What registering gRPC methods one by one costs a grpc.aio server: echo servers
(ModelInfer answered at once with empty bytes) that differ only in how their methods are registered, each
loaded in turn by a grpc.aio client process at the same concurrency, several rounds (odd ones in reverse
order), the server's CPU per call from /proc:

- generic: one generic handler for the service's `--methods` methods (16 by default: hostd's inference service
  has 12, HostdControl 1, Health 3), nothing registered;
- ModelInfer registered: the same, and ModelInfer registered too;
- all registered: every method registered besides, as the generated add_*Servicer_to_server functions do
  (hostd's way), with 16 and with 27 methods.

Why it could matter: a registered method keeps a call request of its own pending in grpc.aio's server loop, and
that loop waits on every pending request again at each call it takes in (`asyncio.wait` over all of them;
`_server_main_loop` in grpc/grpc's grpc/_cython/_cygrpc/aio/server.pyx.pxi, read at its master; grpcio 1.85's
compiled cygrpc has the same `AioServer._request_registered_call`), while a method left unregistered is
found by name in Python at each call. docs/execution.md ("Registering only ModelInfer") has what it gave.

    python -m bench.grpc_registration [--rounds 6] [--seconds 3] [--concurrency 32] [--methods 16]"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time

import grpc
from grpc import aio

from bench._common import cpu_s, free_port

SERVICE = "inference.GRPCInferenceService"


async def _serve(listen: str, methods: int, registered: int) -> None:
    """`methods` in the generic handler (ModelInfer first), the first `registered` of them registered too."""
    async def answer(body: bytes, context) -> bytes:
        return b""

    handlers = {"ModelInfer": grpc.unary_unary_rpc_method_handler(answer)}
    for i in range(max(0, methods - 1)):
        handlers[f"Other{i}"] = grpc.unary_unary_rpc_method_handler(answer)
    server = aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    if registered:
        server.add_registered_method_handlers(SERVICE, dict(list(handlers.items())[:registered]))
    server.add_insecure_port(listen)
    await server.start()
    print("serving", flush=True)
    await server.wait_for_termination()


async def _load(addr: str, concurrency: int, seconds: float) -> None:
    async with aio.insecure_channel(addr) as channel:
        call = channel.unary_unary(f"/{SERVICE}/ModelInfer")
        body = b"\x0a\x05light" + bytes(1000)
        for _ in range(50):
            await call(body)
        done = 0
        stop = time.monotonic() + seconds

        async def worker() -> None:
            nonlocal done
            while time.monotonic() < stop:
                await call(body)
                done += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    print(done, flush=True)


def main() -> None:
    if sys.argv[1:2] == ["serve"]:
        asyncio.run(_serve(sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
        return
    if sys.argv[1:2] == ["load"]:
        asyncio.run(_load(sys.argv[2], int(sys.argv[3]), float(sys.argv[4])))
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--methods", type=int, default=16, help="methods of the service (hostd: 16)")
    a = ap.parse_args()
    m = a.methods
    variants = {"generic": (m, 0), "ModelInfer registered": (m, 1), f"all {m} registered": (m, m),
                f"all {m + 11} registered": (m + 11, m + 11)}
    servers: dict[str, tuple[subprocess.Popen, str]] = {}
    try:
        for name, (methods, n) in variants.items():
            addr = f"127.0.0.1:{free_port()}"
            p = subprocess.Popen([sys.executable, "-m", "bench.grpc_registration", "serve", addr, str(methods), str(n)],
                                 stdout=subprocess.PIPE, text=True)
            servers[name] = (p, addr)  # before the check: stopped in `finally` if it does not serve
            if p.stdout is None or p.stdout.readline().strip() != "serving":
                raise RuntimeError(f"{name} echo server on {addr} did not start (exit code {p.poll()})")
        got: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
        for rnd in range(a.rounds):
            names = list(variants) if rnd % 2 == 0 else list(variants)[::-1]
            for name in names:
                p, addr = servers[name]
                c0 = cpu_s(p.pid)
                out = subprocess.run([sys.executable, "-m", "bench.grpc_registration", "load", addr,
                                      str(a.concurrency), str(a.seconds)], capture_output=True, text=True, check=True)
                calls = int(out.stdout.split()[-1]) + 50
                got[name].append(((cpu_s(p.pid) - c0) / calls * 1e6, (calls - 50) / a.seconds))
            print(f"round {rnd + 1}: " + ", ".join(f"{n} {got[n][-1][0]:.0f} us" for n in variants), flush=True)
    finally:
        for p, _ in servers.values():
            p.kill()
    base = statistics.median(us for us, _ in got["generic"])
    print(f"\nserver CPU per call at concurrency {a.concurrency}, {a.rounds} rounds of {a.seconds:g} s (median; all rounds)")
    for name in variants:
        us = [u for u, _ in got[name]]
        med = statistics.median(us)
        print(f"  {name:<22} {med:6.0f} us ({med - base:+4.0f} us against generic)  rounds "
              + " ".join(f"{u:.0f}" for u in us) + f"  calls/s {statistics.median(r for _, r in got[name]):.0f}")


if __name__ == "__main__":
    main()
