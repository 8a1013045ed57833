"""Python-lane workers (fast_lane_workers): router processes behind the fast lane's HAProxy, each with an event
loop of its own, so that a busy tenant's calls do not queue ahead of another tenant's in one loop. HAProxy picks
the process by the caller's key (router/fastlane_config.py, the `lanes` map), as router/lane_policy.py
assigns tenants; docs/fast-lane.md says what was measured.

A worker is the same Router as this one, started by `python -m router.lane_workers` with the parent's settings
as JSON on its stdin, and these differences (`worker_settings`): it listens on a loopback port of its own in
plaintext (HAProxy holds the tenants' TLS), has no fast lane, REST, health port, upload service or tenant
certificate port (the router itself keeps those), writes its access log to FILE.wN, and serves its metrics on
metrics_port + N. It says its port on stdout once it serves. The router starts a worker again at its next
refresh when it exits (`ensure_running`); meanwhile HAProxy sends its tenants to the router itself (each
worker's backend has the router as its backup server).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping
from typing import Any

log = logging.getLogger(__name__)

START_TIMEOUT_S = 60.0  # a worker imports and starts the whole router


def worker_settings(parent: Mapping[str, Any], index: int) -> dict[str, Any]:
    """The settings (as `RouterSettings.model_dump(mode="json")`) of worker `index` (1..n) from its parent's."""
    s = dict(parent)
    access = s.get("access_log")
    s.update(
        listen="127.0.0.1:0", fast_lane="off", fast_lane_workers=0, plaintext=True, tls_cert=None, tls_key=None,
        tls_client_ca=None, tls_client_listen="", rest_listen="", health_port=0, uploads=False,
        access_log=f"{access}.w{index}" if access and access != "-" else access,
        metrics_port=(s["metrics_port"] + index) if s.get("metrics_port") else 0,
    )
    return s


class LaneWorker:
    """One worker process: started, watched, stopped by the router (router/server.py)."""

    def __init__(self, index: int, settings_json: str) -> None:
        self.index, self._json = index, settings_json
        self.proc: subprocess.Popen | None = None
        self.address = ""  # 127.0.0.1:port once it serves
        self.starts = 0

    @property
    def up(self) -> bool:
        return self.proc is not None and self.proc.poll() is None and bool(self.address)

    async def start(self) -> None:
        self.address = ""
        self.starts += 1
        self.proc = subprocess.Popen([sys.executable, "-m", "router.lane_workers"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env={**os.environ, "MMHOST_LANE_WORKER": str(self.index),
                                          "MMHOST_LANE_WORKER_LOG_LEVEL": logging.getLevelName(logging.getLogger().level)})
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(self._json.encode() + b"\n")  # kept open: the worker stops when it closes
        self.proc.stdin.flush()
        try:
            line = await asyncio.wait_for(asyncio.to_thread(self.proc.stdout.readline), START_TIMEOUT_S)
        except asyncio.TimeoutError:
            self.proc.kill()
            raise RuntimeError(f"Python-lane worker {self.index} did not start within {START_TIMEOUT_S:.0f} s") from None
        try:
            port = int(json.loads(line)["port"])
        except (ValueError, KeyError, TypeError):
            code = self.proc.wait()
            raise RuntimeError(f"Python-lane worker {self.index} exited at start (code {code}); its log says why") from None
        self.address = f"127.0.0.1:{port}"
        log.info("Python-lane worker %d serving on %s (pid %d)", self.index, self.address, self.proc.pid)

    async def ensure_running(self) -> bool:
        """Start it again if it exited. True if it was restarted."""
        if self.up or self.proc is None:
            return False
        log.error("Python-lane worker %d exited (code %s); starting it again", self.index, self.proc.returncode)
        await self.start()
        return True

    async def stop(self, grace_s: float = 3.0) -> None:
        p = self.proc
        if p is None or p.poll() is not None:
            return
        p.send_signal(signal.SIGTERM)  # the router's own graceful stop (run_until_signal)
        if p.stdin is not None:
            p.stdin.close()
        try:
            await asyncio.to_thread(p.wait, grace_s)
        except subprocess.TimeoutExpired:
            p.kill()
            await asyncio.to_thread(p.wait)


async def _serve(settings_json: dict[str, Any]) -> None:
    from ground.serving import run_until_signal
    from ground.settings import RouterSettings, S3Settings
    from router.server import Router

    router = Router(RouterSettings(**settings_json), S3Settings())

    async def start() -> None:
        await router.start()
        sys.stdout.write(json.dumps({"port": router.port}) + "\n")
        sys.stdout.flush()

    await run_until_signal(start, router.stop)


def _stop_at_eof() -> None:
    sys.stdin.read()
    os.kill(os.getpid(), signal.SIGTERM)


def main() -> None:
    settings = json.loads(sys.stdin.readline())
    index = os.environ.get("MMHOST_LANE_WORKER", "?")
    logging.basicConfig(level=os.environ.get("MMHOST_LANE_WORKER_LOG_LEVEL", "INFO"),
                        format=f"%(asctime)s %(levelname)s lane-worker-{index} %(name)s: %(message)s")
    # stdin stays open while the router lives: at its end (the router exited, even killed) this worker stops
    threading.Thread(target=_stop_at_eof, name="lane-worker-parent", daemon=True).start()
    from ground.serving import exit_after

    asyncio.run(exit_after(_serve(settings)))


if __name__ == "__main__":
    main()
