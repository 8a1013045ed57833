"""Real servers for tests: redis-server and moto_server started as processes on free ports."""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


_BELOW_EPHEMERAL = (20000, 32768)  # Linux's ephemeral range starts at 32768 (net.ipv4.ip_local_port_range)
_given: set[int] = set()


def free_port() -> int:
    """A port free now, for a server started next. Taken below the ephemeral range: a port the kernel hands out
    for bind(0) is one it also hands out as the source port of outgoing connections (every gRPC channel, health
    check and Redis client here), and once a test router failed to start on a port a connection had taken
    meanwhile ('Address already in use' on its metrics port)."""
    lo, hi = _BELOW_EPHEMERAL
    try:
        lo_eph = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
        hi = min(hi, lo_eph)
    except (OSError, ValueError, IndexError):
        pass
    for _ in range(64):
        port = random.randrange(lo, hi) if hi > lo else 0
        if port in _given:  # never the same port twice in a session (two ports taken before either is bound)
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            _given.add(port)
            return port
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


class SilentServer:
    """A TCP server that accepts connections and never answers: storage or Redis that hangs, rather than
    refusing. `accepted` counts the connections it took. A context manager."""

    def __init__(self) -> None:
        import threading

        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.accepted = 0
        self._conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:  # closed
                return
            self._conns.append(conn)
            self.accepted += 1

    def __enter__(self) -> SilentServer:
        return self

    def __exit__(self, *exc) -> None:
        self._sock.close()
        for c in self._conns:
            c.close()


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


REPO = Path(__file__).resolve().parent.parent


class ServerProc:
    """A `mmhost <role>` process on a free port, logging to a file in `workdir`, with a gRPC channel to it.
    Subclasses build the command line; this owns start, readiness, logs, metrics and stop."""

    role = "server"
    ready_timeout_s = 60.0
    stop_timeout_s = 30.0

    def __init__(self, workdir: Path, cmd_args: list[str], env: dict[str, str] | None = None,
                 channel_options: list | None = None, channel_credentials=None, health_port: int = 0) -> None:
        """A TLS server: `channel_credentials` for `self.channel`, and `health_port` (its plaintext health
        service, which readiness is polled on)."""
        import grpc

        workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = workdir / f"{self.role}-{self.port}.log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mmhost.cli", self.role, *cmd_args], cwd=REPO, stdout=self._log,
            stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
        )
        self.health_addr = f"127.0.0.1:{health_port}" if health_port else self.addr
        self.channel = (grpc.secure_channel(self.addr, channel_credentials, options=channel_options or [])
                        if channel_credentials is not None else grpc.insecure_channel(self.addr, options=channel_options or []))
        self.wait_serving()

    def alloc_ports(self) -> None:
        self.port = free_port()
        self.metrics_port = free_port()
        self.addr = f"127.0.0.1:{self.port}"

    def wait_serving(self, timeout: float | None = None) -> None:
        from ground.serving import wait_serving

        wait_serving(self.health_addr, self.proc, self.role, self.log, timeout or self.ready_timeout_s)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-5000:]

    def errors(self, limit: int = 4000) -> str:
        """The log from its last ERROR line on (a traceback follows it), at most `limit` characters: what a
        failed test prints where a call came back INTERNAL, whose cause only the server's log has."""
        text = self.log_path.read_text(errors="replace")
        starts = [m.start() for m in re.finditer(r"^\S+ \S+ ERROR ", text, re.M)]
        return f"\n{self.role} log, last error:\n{text[starts[-1]:][:limit]}" if starts else f"\nno ERROR in the {self.role} log"

    def event_loops(self) -> list[str]:
        """The event loop each start line in the log says it serves on (ground/eventloop.py), in order: a
        router's Python-lane workers log into the router's. [] before the first."""
        return re.findall(rf"{self.role} serving on .*event loop (\w+)\)$", self.log_path.read_text(errors="replace"),
                          re.M)

    def metrics_text(self) -> str:
        import urllib.request

        return urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5).read().decode()

    def stop(self, sig: int = signal.SIGTERM, timeout: float | None = None) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout or self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.channel.close()
        self._log.close()
        return self.proc.returncode


def haproxy_ask(admin_socket: Path | str, line: str) -> str:
    """One command on HAProxy's runtime API (a unix socket), its whole answer."""
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(admin_socket))
        s.sendall(line.encode() + b"\n")
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out.decode()
