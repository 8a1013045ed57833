"""Start a hostd as a real process on a free port and talk to it over gRPC."""

from __future__ import annotations

from pathlib import Path

from protos import grpc_service_pb2_grpc, hostd_control_pb2, hostd_control_pb2_grpc
from tests.servers import ServerProc


class HostdProc(ServerProc):
    role = "hostd"

    def __init__(self, store: str, workdir: Path, *, env: dict[str, str] | None = None, args: list[str] | None = None,
                 tenant: str = "demo", **kw) -> None:
        """`kw`: ServerProc's channel_credentials, health_port and more channel_options (a hostd with TLS)."""
        self.alloc_ports()
        cmd = ["--listen", self.addr, "--store", store, "--metrics-port", str(self.metrics_port),
               "--cache-dir", str(workdir / f"cache-{self.port}"), "--ort-threads", "1", "--default-tenant", tenant,
               *(args or [])]
        # plaintext and dev mode (direct calls without mmhost-tenant act as `tenant`) unless `env` says otherwise;
        # no linger after a drain (1 s by default, for routers to see it) unless `env` asks for one: a test that
        # stops a hostd waits for the process to end
        super().__init__(workdir, cmd, {"MMHOST_HOSTD_TORCH_THREADS": "1", "MMHOST_HOSTD_PLAINTEXT": "true",
                                        "MMHOST_HOSTD_DEV_MODE": "true", "MMHOST_HOSTD_DRAIN_LINGER_S": "0",
                                        **(env or {})},
                         [("grpc.max_receive_message_length", 256 << 20), ("grpc.max_send_message_length", 256 << 20),
                          *kw.pop("channel_options", ())], **kw)
        self.stub = grpc_service_pb2_grpc.GRPCInferenceServiceStub(self.channel)
        self.control = hostd_control_pb2_grpc.HostdControlStub(self.channel)

    def status(self) -> hostd_control_pb2.HostStatus:
        return self.control.Status(hostd_control_pb2.StatusRequest(), timeout=5)


def metric_value(text: str, name: str, without: tuple[str, ...] = (), **labels: str) -> float:
    """Sum of the samples of `name` whose labels include `labels` and none of `without`, from a Prometheus text
    page (a router's port also serves its Python-lane workers' series: `without=("lane_worker",)` is its own)."""
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if (s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
                    and not any(k in s.labels for k in without)):
                total += s.value
    return total
