"""Start `mmhost router` as a real process on a free port and call it over gRPC."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import grpc

from protos import grpc_service_pb2_grpc
from tests.hostd_proc import REPO
from tests.servers import free_port, wait_grpc_serving


class RouterProc:
    def __init__(self, workdir: Path, args: list[str], env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.metrics_port = free_port()
        self.addr = f"127.0.0.1:{self.port}"
        workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = workdir / f"router-{self.port}.log"
        self.access_log = workdir / f"access-{self.port}.jsonl"
        cmd = [sys.executable, "-m", "mmhost.cli", "router", "--listen", self.addr, "--metrics-port",
               str(self.metrics_port), "--access-log", str(self.access_log), *args]
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=self._log, stderr=subprocess.STDOUT,
                                     env={**os.environ, **(env or {})})
        self.channel = grpc.insecure_channel(self.addr)
        self.stub = grpc_service_pb2_grpc.GRPCInferenceServiceStub(self.channel)
        self.wait_serving()

    def wait_serving(self, timeout: float = 30.0) -> None:
        wait_grpc_serving(self.channel, self.proc, "router", self.log, timeout)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-5000:]

    def metrics_text(self) -> str:
        import urllib.request

        return urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5).read().decode()

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.channel.close()
        self._log.close()
        return self.proc.returncode
