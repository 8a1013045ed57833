"""Real servers for tests: redis-server and moto_server started as processes on free ports."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float = 20.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening on {port}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listening on port {port} after {timeout}s")


class RedisServer:
    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        exe = shutil.which("redis-server") or "/usr/bin/redis-server"
        self.proc = subprocess.Popen(
            [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(workdir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        wait_port(self.port, proc=self.proc)
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


class MotoServer:
    """moto's standalone S3-compatible HTTP server (moto[server]), a real process speaking HTTP."""

    def __init__(self) -> None:
        self.start()

    def start(self, port: int | None = None) -> None:
        self.port = port or free_port()
        exe = Path(sys.executable).with_name("moto_server")
        self.proc = subprocess.Popen(
            [str(exe), "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env={**os.environ, "MOTO_ALLOW_NONEXISTENT_REGION": "true"},
        )
        wait_port(self.port, timeout=30, proc=self.proc)
        self.endpoint = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def wait_grpc_serving(channel, proc: subprocess.Popen, what: str, log, timeout: float = 60.0) -> None:
    """Poll grpc.health.v1 on `channel` until SERVING; fail fast (with the log) if the process exits."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    health = health_pb2_grpc.HealthStub(channel)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}:\n{log()}")
        try:
            if health.Check(health_pb2.HealthCheckRequest(), timeout=1).status == health_pb2.HealthCheckResponse.SERVING:
                return
        except grpc.RpcError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{what} not serving after {timeout}s:\n{log()}")
