"""`mmhost demo` (what `make demo` runs) end to end, as a user meets it: it builds the demo store, starts two
hostds and a router on the ports given, prints a key and copy-paste calls; the printed gRPC client call and the
printed REST call both answer; Ctrl-C (SIGINT) stops the router and both hostds; a second start rotates the
key, and the old key is refused."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest

from tests.servers import free_port

pytestmark = pytest.mark.timeout(240)
ROOT = Path(__file__).resolve().parents[2]


def _free_run(n: int) -> int:
    """A port p with p .. p + n - 1 all free (the demo's router metrics port and its hostds' next ones)."""
    for _ in range(50):
        p = free_port()
        try:
            for q in range(p, p + n):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", q))
            return p
        except OSError:
            continue
    raise RuntimeError("no run of free ports")


class Demo:
    def __init__(self, tmp: Path) -> None:
        self.listen, self.rest = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        self.hostd_ports = [free_port(), free_port()]
        self.metrics = _free_run(3)
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mmhost.cli", "demo", "--listen", self.listen, "--rest-listen", self.rest,
             "--hostd-ports", ",".join(map(str, self.hostd_ports)), "--metrics-port", str(self.metrics),
             "--store", str(tmp / "store"), "--workdir", str(tmp / "work")],
            cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)})
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, pattern: str, timeout: float = 150) -> None:
        deadline = time.monotonic() + timeout
        while not any(re.search(pattern, line) for line in self.lines):
            assert self.proc.poll() is None, "\n".join(self.lines[-40:])
            assert time.monotonic() < deadline, "\n".join(self.lines[-40:])
            time.sleep(0.2)

    @property
    def key(self) -> str:
        return next(m.group(0) for line in self.lines if (m := re.search(r"mmk_[A-Za-z0-9_-]+", line)))

    def snippet(self, first: str, last: str | None = None, count: int = 1) -> str:
        """The printed lines from the one that starts with `first` through the one that is `last` (or `count`)."""
        start = next(i for i, line in enumerate(self.lines) if line.startswith(first))
        end = start + count - 1 if last is None else next(i for i in range(start, len(self.lines))
                                                          if self.lines[i] == last)
        return "\n".join(self.lines[start:end + 1])

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_the_demo_serves_the_calls_it_prints_and_stops_on_ctrl_c(tmp_path):
    d = Demo(tmp_path)
    try:
        d.wait_for(r"^mmhost upload model\.onnx")  # the last thing it prints before serving
        d.wait_for(r"router serving on")
        key = d.key
        client = d.snippet(sys.executable, "PY")  # the gRPC call, as printed
        out = subprocess.run(["bash", "-c", client], capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert out.returncode == 0, out.stderr[-2000:]
        array, _, names = out.stdout.strip().rpartition("\n")
        assert len(re.findall(r"-?\d+\.\d*(?:e[-+]\d+)?", array)) == 2 * 10, out.stdout  # 2 rows of 10 outputs
        assert names == "['exported', 'mlp', 'scripted', 'typed']", out.stdout
        curl = d.snippet("curl -s", count=2)  # the REST call, as printed (two lines, the second its body)
        out = subprocess.run(["bash", "-c", curl], capture_output=True, text=True, timeout=60)
        answer = json.loads(out.stdout)
        assert answer["model_name"] == "mlp" and answer["outputs"][0]["shape"] == [1, 10], out.stdout
    finally:
        code = d.stop()
    assert code == 0, "\n".join(d.lines[-30:])
    for port in (int(d.listen.rsplit(":", 1)[1]), *d.hostd_ports, d.metrics):  # router and both hostds gone
        assert not _listening(port), port

    again = Demo(tmp_path)  # same workdir: a new key, and the old one no longer opens the door
    try:
        again.wait_for(r"router serving on")
        assert again.key != key
        from protos import grpc_service_pb2 as pb
        from protos import grpc_service_pb2_grpc as pbg

        with grpc.insecure_channel(again.listen) as ch:
            stub = pbg.GRPCInferenceServiceStub(ch)
            with pytest.raises(grpc.RpcError) as e:
                stub.ModelReady(pb.ModelReadyRequest(name="mlp"), metadata=(("authorization", f"Bearer {key}"),),
                                timeout=10)
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
            ok = stub.ModelReady(pb.ModelReadyRequest(name="mlp"),
                                 metadata=(("authorization", f"Bearer {again.key}"),), timeout=10)
            assert ok.ready
    finally:
        assert again.stop() == 0
