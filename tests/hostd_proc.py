"""Start a hostd as a real process on a free port and talk to it over gRPC."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import grpc

from protos import grpc_service_pb2_grpc, hostd_control_pb2, hostd_control_pb2_grpc
from tests.servers import free_port, wait_grpc_serving

REPO = Path(__file__).resolve().parent.parent


class HostdProc:
    def __init__(self, store: str, workdir: Path, *, env: dict[str, str] | None = None, args: list[str] | None = None,
                 tenant: str = "demo") -> None:
        self.port = free_port()
        self.metrics_port = free_port()
        self.addr = f"127.0.0.1:{self.port}"
        workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = workdir / f"hostd-{self.port}.log"
        cmd = [
            sys.executable, "-m", "mmhost.cli", "hostd", "--listen", self.addr, "--store", store,
            "--metrics-port", str(self.metrics_port), "--cache-dir", str(workdir / f"cache-{self.port}"),
            "--ort-threads", "1", "--default-tenant", tenant, *(args or []),
        ]
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            cmd, cwd=REPO, stdout=self._log, stderr=subprocess.STDOUT,
            env={**os.environ, "MMHOST_HOSTD_TORCH_THREADS": "1", **(env or {})},
        )
        self.channel = grpc.insecure_channel(self.addr, options=[("grpc.max_receive_message_length", 256 << 20),
                                                                 ("grpc.max_send_message_length", 256 << 20)])
        self.stub = grpc_service_pb2_grpc.GRPCInferenceServiceStub(self.channel)
        self.control = hostd_control_pb2_grpc.HostdControlStub(self.channel)
        self.wait_serving()

    def wait_serving(self, timeout: float = 60.0) -> None:
        wait_grpc_serving(self.channel, self.proc, "hostd", self.log, timeout)

    def status(self) -> hostd_control_pb2.HostStatus:
        return self.control.Status(hostd_control_pb2.StatusRequest(), timeout=5)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-5000:]

    def metrics_text(self) -> str:
        import urllib.request

        return urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5).read().decode()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.channel.close()
        self._log.close()
        return self.proc.returncode


def metric_value(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of `name` whose labels include `labels`, from a Prometheus text page."""
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total
