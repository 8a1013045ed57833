"""ground.children on real processes: a child started with dies_with_parent runs its program (pid, output and exit
code its own), ends when its parent is killed, and starts cleanly from a process whose gRPC threads are busy (with
Popen's preexec_fn, 34 of 300 such children died of SIGABRT or SIGSEGV before exec)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from ground.children import dies_with_parent


def _cmdline_once_it_execs(pid: int, program: bytes) -> list[bytes]:
    """The process's argv once it runs `program` (polled: the exec follows the shim's start)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not Path(f"/proc/{pid}/cmdline").read_bytes().startswith(program + b"\0"):
        time.sleep(0.02)
    return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]


def test_the_child_is_the_program_with_its_output_and_exit_code():
    p = subprocess.run(dies_with_parent(["sh", "-c", "echo hi from $$; exit 3"]), capture_output=True, text=True,
                       timeout=30)
    assert p.returncode == 3
    assert p.stdout.strip().startswith("hi from ")
    q = subprocess.Popen(dies_with_parent(["sleep", "infinity"]))
    try:
        assert _cmdline_once_it_execs(q.pid, b"sleep") == [b"sleep", b"infinity"]  # exec kept the pid
    finally:
        q.kill()
        q.wait()


def test_the_child_ends_when_its_parent_is_killed(tmp_path):
    parent = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys\n"
         "from ground.children import dies_with_parent\n"
         "c = subprocess.Popen(dies_with_parent(['sleep', 'infinity']))\n"
         "print(c.pid, flush=True)\n"
         "sys.stdin.read()\n"],  # holds until it is killed
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2])
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    assert _cmdline_once_it_execs(child, b"sleep") == [b"sleep", b"infinity"]
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    parent.stdin.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{child}/stat").read_text().split()[2] == "Z":  # reaped by init soon
                break
        except FileNotFoundError:
            break
        time.sleep(0.05)
    else:
        os.kill(child, signal.SIGKILL)
        raise AssertionError("the child outlived its SIGKILLed parent")


async def _start_children_under_grpc_traffic(n: int) -> Counter:
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    stop = False

    async def client() -> None:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            while not stop:
                await stub.Check(health_pb2.HealthCheckRequest())

    clients = [asyncio.create_task(client()) for _ in range(8)]
    codes: Counter = Counter()
    try:
        for _ in range(n):
            p = subprocess.Popen(dies_with_parent(["true"], signal.SIGUSR1))
            while p.poll() is None:
                await asyncio.sleep(0.002)
            codes[p.returncode] += 1
    finally:
        stop = True
        await asyncio.gather(*clients, return_exceptions=True)
        await server.stop(None)
    return codes


def test_children_start_cleanly_while_grpc_threads_are_busy():
    codes = asyncio.run(_start_children_under_grpc_traffic(120))
    assert codes == Counter({0: 120})
