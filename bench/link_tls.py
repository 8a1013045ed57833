"""The router's cost with mutual TLS to its hostd, in one run: one hostd serving mTLS (as in deploy/), called
straight with the router's client certificate ('direct'), through a router whose streams ride the hostd's data
link with TLS ('router': ground/link_tls.py), through the same router with its streams on gRPC ('router grpc',
hostd_data_link=false) and with one gRPC call per forward ('router unary', hostd_streams=0). Tenants reach the
routers in plaintext, so only the router-to-hostd leg differs from bench/router.py. Prints throughput kept
against direct, p50 added and CPU per request of each process (from /proc, over the measured window).

    python -m bench.link_tls [--seconds 4] [--levels 1,32] [--dims 256,3500,3500,10 | --small]"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import free_port, start_hostd, stop  # noqa: E402
from bench.router import (levels_and_dims, load_args, measure_rounds, measured, model_and_tenant, print_table,  # noqa: E402
                          start_router)
from ground.tls import HOSTD_TLS_NAME  # noqa: E402
from ground.wire import TENANT_HEADER  # noqa: E402
from mmhost.certs import init as make_certs  # noqa: E402


def main() -> None:
    a = load_args("1,32").parse_args()
    levels, dims = levels_and_dims(a)
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        pki = make_certs(t / "pki")
        key = model_and_tenant(t, dims, f"{a.seconds:.0f}s per point; router -> hostd mutual TLS")
        hp = free_port()
        (hcert, hkey), ca, (rcert, rkey) = pki["hostd"], pki["ca"][0], pki["router-client"]
        hostd, haddr = start_hostd(str(t / "store"), t, "--preload", health_port=hp, env={
            "MMHOST_HOSTD_PLAINTEXT": "false", "MMHOST_HOSTD_DEV_MODE": "false", "MMHOST_HOSTD_TLS_CERT": str(hcert),
            "MMHOST_HOSTD_TLS_KEY": str(hkey), "MMHOST_HOSTD_TLS_CLIENT_CA": str(ca),
            "MMHOST_HOSTD_HEALTH_PORT": str(hp)})
        tls_env = {"MMHOST_ROUTER_HOSTD_CA": str(ca), "MMHOST_ROUTER_HOSTD_CLIENT_CERT": str(rcert),
                   "MMHOST_ROUTER_HOSTD_CLIENT_KEY": str(rkey)}
        procs = {
            "router": start_router(haddr, t / "tenants.json", t / "store", t, env=tls_env),
            "router grpc": start_router(haddr, t / "tenants.json", t / "store", t,
                                        env={**tls_env, "MMHOST_ROUTER_HOSTD_DATA_LINK": "false"}),
            "router unary": start_router(haddr, t / "tenants.json", t / "store", t,
                                         env={**tls_env, "MMHOST_ROUTER_HOSTD_STREAMS": "0"}),
        }
        direct_kw = {"ssl": True, "root_certificates": str(ca), "private_key": str(rkey),
                     "certificate_chain": str(rcert), "channel_args": [("grpc.ssl_target_name_override", HOSTD_TLS_NAME)]}
        try:
            x = np.random.default_rng(0).random((1, dims[0]), dtype=np.float32)
            paths = [(name, addr, {"authorization": f"Bearer {key}"}, {"hostd": hostd.pid, "router": proc.pid})
                     for name, (proc, addr) in procs.items()]
            rows = measure_rounds(a, levels, paths,
                                  lambda c: measured(haddr, x, c, a.seconds, {TENANT_HEADER: "bench"},
                                                     {"hostd": hostd.pid}, client_kw=direct_kw),
                                  lambda addr, c, h, pids: measured(addr, x, c, a.seconds, h, pids))
            links = {n: _links(proc.pid, haddr, addr) for n, (proc, addr) in procs.items()}
        finally:
            for proc, _ in procs.values():
                stop(proc)
            stop(hostd)
    print_table(rows)
    print("connections from each router to hostd other than its gRPC port (data links): "
          + ", ".join(f"{n} {k}" for n, k in links.items()))


def _links(pid: int, hostd: str, listen: str) -> int:
    """A router's open TCP connections to hostd's address on a port other than hostd's gRPC port: its links."""
    import psutil

    grpc_port, own = int(hostd.rsplit(":", 1)[1]), int(listen.rsplit(":", 1)[1])
    return sum(1 for k in psutil.Process(pid).net_connections("tcp") if k.raddr and k.status == "ESTABLISHED"
               and k.laddr.port != own and k.raddr.port != grpc_port)


if __name__ == "__main__":
    main()
