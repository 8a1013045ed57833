"""Start `mmhost router` as a real process on a free port and call it over gRPC."""

from __future__ import annotations

from pathlib import Path

from protos import grpc_service_pb2_grpc
from tests.servers import ServerProc


class RouterProc(ServerProc):
    role = "router"
    ready_timeout_s = 30.0
    stop_timeout_s = 15.0

    def __init__(self, workdir: Path, args: list[str], env: dict[str, str] | None = None, **kw) -> None:
        """Plaintext unless `env` says otherwise; `kw`: ServerProc's channel_credentials and health_port."""
        self.alloc_ports()
        self.access_log = workdir / f"access-{self.port}.jsonl"
        super().__init__(workdir, ["--listen", self.addr, "--metrics-port", str(self.metrics_port),
                                   "--access-log", str(self.access_log), *args],
                         {"MMHOST_ROUTER_PLAINTEXT": "true", **(env or {})}, **kw)
        self.stub = grpc_service_pb2_grpc.GRPCInferenceServiceStub(self.channel)

    def data_links(self, host) -> int:
        """This router's open connections to `host`'s (a HostdProc's) data link port."""
        import psutil

        port = host.status().data_port
        return sum(1 for k in psutil.Process(self.proc.pid).net_connections("tcp")
                   if k.raddr and k.raddr.port == port and k.status == "ESTABLISHED")
