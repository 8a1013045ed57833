"""Python-lane workers (fast_lane_workers): router processes behind the fast lane's HAProxy, each with an event
loop of its own, so that a busy tenant's calls do not queue ahead of another tenant's in one loop. HAProxy picks
the process by the caller's key (router/fastlane_config.py, the `lanes` map), as router/lane_policy.py
assigns tenants; docs/fast-lane.md says what was measured.

A worker is the same Router as this one, started by `python -m router.lane_workers` with the parent's settings
as JSON on its stdin (kept open: it stops at its end), and these differences (`worker_settings`): it listens on
a loopback port of its own in plaintext (HAProxy holds the tenants' TLS), has no fast lane, REST, health port,
upload service or tenant certificate port (the router itself keeps those), writes its access log to FILE.wN,
and (where the router has a metrics port) serves its metrics on a free port of 127.0.0.1, which the router's
own metrics port re-exports with `lane_worker="N"` at each scrape (`metrics_sources`, ground/metrics_merge.py).
It says both ports on a pipe of its own once it serves. Not metrics_port + N, as before: a port next to the
router's may be anyone's (a test's worker once failed to start, 'Address already in use' on it), and one the
kernel hands out free is taken in the same bind. The router starts a worker again at its next refresh when it
exits (`LaneWorkers.lanes`); meanwhile HAProxy sends its tenants to the router itself (each worker's backend has the router as its backup
server).
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
from typing import TYPE_CHECKING, Any

from router.fastlane_config import lane_backend
from router.lane_policy import assign_lanes, lane_loads

if TYPE_CHECKING:
    from ground.settings import RouterSettings
    from router.fastlane import FastLane
    from router.metrics import RouterMetrics

log = logging.getLogger(__name__)

START_TIMEOUT_S = 60.0  # a worker imports and starts the whole router
RESTART_BACKOFF_S = 5.0  # a worker that failed to start is tried again this much later


def worker_settings(parent: Mapping[str, Any], index: int, quota_id: str = "") -> dict[str, Any]:
    """The settings (as `RouterSettings.model_dump(mode="json")`) of worker `index` (1..n) from its parent's;
    `quota_id`: the name the router counts under among the live routers (fleet quotas), which its workers share."""
    s = dict(parent)
    access = s.get("access_log")
    s.update(
        listen="127.0.0.1:0", fast_lane="off", fast_lane_workers=0, plaintext=True, tls_cert=None, tls_key=None,
        tls_client_ca=None, tls_client_listen="", rest_listen="", health_port=0, uploads=False,
        access_log=f"{access}.w{index}" if access and access != "-" else access,
        metrics_host="127.0.0.1", metrics_port=0, quota_router_id=quota_id,
    )
    return s


def worker_serves_metrics(parent: Mapping[str, Any]) -> bool:
    """Whether the workers of a router with these settings serve metrics (on a free port each): where the router
    has a metrics port to re-export them on."""
    return bool(parent.get("metrics_port"))


class LaneWorker:
    """One worker process: started, watched, stopped by the router (router/server.py)."""

    def __init__(self, index: int, settings: Mapping[str, Any], metrics: bool = False) -> None:
        """`settings`: worker_settings(...), as JSON-ready values; `metrics`: it serves its metrics (on a port
        it says at start)."""
        self.index, self._json, self.serves_metrics = index, json.dumps(settings), metrics
        self.metrics_port = 0  # on 127.0.0.1, as the worker now serving said; 0 = none
        self.proc: subprocess.Popen | None = None
        self.address = ""  # 127.0.0.1:port once it serves

    @property
    def up(self) -> bool:
        return self.proc is not None and self.proc.poll() is None and bool(self.address)

    @property
    def exited(self) -> bool:
        return self.proc is not None and self.proc.poll() is not None

    async def start(self) -> None:
        self.address, self.metrics_port = "", 0
        # the ports come back on a pipe of its own: the worker's stdout is the router's (access_log "-")
        rfd, wfd = os.pipe()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "router.lane_workers"], stdin=subprocess.PIPE, pass_fds=(wfd,),
                env={**os.environ, "MMHOST_LANE_WORKER": str(self.index), "MMHOST_LANE_WORKER_PORT_FD": str(wfd),
                     "MMHOST_LANE_WORKER_METRICS": "1" if self.serves_metrics else "",
                     "MMHOST_LANE_WORKER_LOG_LEVEL": logging.getLevelName(logging.getLogger().level)})
        finally:
            os.close(wfd)
        assert self.proc.stdin is not None
        self.proc.stdin.write(self._json.encode() + b"\n")  # kept open: the worker stops when it closes
        self.proc.stdin.flush()
        with os.fdopen(rfd, "rb") as said:  # EOF if the worker exits first
            try:
                line = await asyncio.wait_for(asyncio.to_thread(said.readline), START_TIMEOUT_S)
            except asyncio.TimeoutError:
                self.proc.kill()
                await asyncio.to_thread(self.proc.wait)
                raise RuntimeError(f"Python-lane worker {self.index} did not start within {START_TIMEOUT_S:.0f} s") from None
        try:
            said_ports = json.loads(line)
            port, metrics_port = int(said_ports["port"]), int(said_ports.get("metrics_port") or 0)
        except (ValueError, KeyError, TypeError, AttributeError):
            code = await asyncio.to_thread(self.proc.wait)
            raise RuntimeError(f"Python-lane worker {self.index} exited at start (code {code}); its log says why") from None
        self.address, self.metrics_port = f"127.0.0.1:{port}", metrics_port
        log.info("Python-lane worker %d serving on %s (pid %d%s)", self.index, self.address, self.proc.pid,
                 f", metrics on port {metrics_port}" if metrics_port else "")

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


class LaneWorkers:
    """The router's Python-lane workers and each tenant's lane (router/server.py holds one): started with the
    router, watched at each fast-lane refresh, stopped with it."""

    def __init__(self, settings: RouterSettings, metrics: RouterMetrics, quota_id: str) -> None:
        """`quota_id`: the router's name among the live routers (fleet quotas), which its workers count under."""
        parent = settings.model_dump(mode="json")
        self.workers = [LaneWorker(i, worker_settings(parent, i, quota_id), worker_serves_metrics(parent))
                        for i in range(1, settings.fast_lane_workers + 1)]
        self.rebalance_ratio = settings.fast_lane_rebalance_ratio
        self.metrics = metrics
        self.lane_of: dict[str, int] = {}  # tenant -> its lane (0: the router itself; router/lane_policy.py)
        self._restarting: dict[int, asyncio.Task] = {}

    @property
    def addresses(self) -> list[str]:
        return [w.address for w in self.workers]

    def metrics_sources(self) -> list[tuple[str, str | None]]:
        """(worker index, URL) of each worker's metrics port, for the router's port to re-export (empty without
        metrics_port): read at each scrape, so a restarted worker is back at once with the port it said. A worker
        not serving now has no URL (left out of the scrape and counted as not read): the port it had is free
        for anyone since it exited."""
        return [(str(w.index), f"http://127.0.0.1:{w.metrics_port}/metrics" if w.up and w.metrics_port else None)
                for w in self.workers if w.serves_metrics]

    async def start(self) -> None:
        try:
            await asyncio.gather(*(w.start() for w in self.workers))
        except RuntimeError:
            await self.stop()
            raise

    async def stop(self) -> None:
        for t in self._restarting.values():
            t.cancel()
        await asyncio.gather(*(w.stop() for w in self.workers))

    async def _restart(self, w: LaneWorker, fl: FastLane) -> None:
        """Start an exited worker again, off the refresh (a start takes seconds), then point its backend at it.
        A worker that fails to start is tried again after RESTART_BACKOFF_S, not at every refresh."""
        try:
            log.error("Python-lane worker %d exited (code %s); starting it again", w.index, w.proc and w.proc.returncode)
            await w.start()
            self.metrics.lane_worker_restarts.inc()
            await fl.set_worker(w.index, w.address)
        except Exception as e:  # noqa: BLE001 - HAProxy serves its tenants from the router (backup) meanwhile
            log.error("%s", e)
            await asyncio.sleep(RESTART_BACKOFF_S)
        finally:
            self._restarting.pop(w.index, None)

    async def lanes(self, fl: FastLane, keys: Mapping[str, str]) -> dict[str, str]:
        """At each fast-lane refresh: restart the workers that exited, then each tenant's lane from the rates
        HAProxy counted (`keys`: key hash -> tenant). Returns the `lanes` map, key hash -> worker backend."""
        m = self.metrics
        for w in self.workers:
            if w.exited and w.index not in self._restarting:
                self._restarting[w.index] = asyncio.get_running_loop().create_task(self._restart(w, fl))
        m.lane_workers_up.set(sum(w.up for w in self.workers))
        rates: dict[str, float] = {}
        for h, r in (await fl.lane_rates()).items():
            if h in keys:
                rates[keys[h]] = rates.get(keys[h], 0.0) + r
        n = len(self.workers) + 1
        before, self.lane_of = self.lane_of, assign_lanes(rates, n, self.lane_of, rebalance_ratio=self.rebalance_ratio)
        for t, lane in self.lane_of.items():
            if t in before and before[t] != lane:
                m.lane_moves.inc()
                log.info("Python-lane workers: tenant %s moves from lane %d to lane %d (%.0f calls/s)", t, before[t],
                         lane, rates.get(t, 0.0))
        loads = lane_loads(rates, self.lane_of, n)
        for i in range(n):
            m.lane_tenants.labels(str(i)).set(sum(1 for lane in self.lane_of.values() if lane == i))
            m.lane_rate.labels(str(i)).set(loads[i])
        return {h: lane_backend(self.lane_of[t]) for h, t in keys.items() if self.lane_of.get(t, 0) > 0}


async def _serve(settings: RouterSettings) -> None:
    from ground.serving import run_until_signal
    from ground.settings import S3Settings
    from router.server import Router

    router = Router(settings, S3Settings())

    async def start() -> None:
        await router.start()
        said: dict[str, int] = {"port": router.port}
        if os.environ.get("MMHOST_LANE_WORKER_METRICS"):  # a free port, said with the other: none to clash
            from ground.metrics_http import serve_metrics

            router.metrics_http = serve_metrics("127.0.0.1", 0, router.metrics.registry)  # closed by router.stop
            said["metrics_port"] = router.metrics_http.port
        fd = int(os.environ["MMHOST_LANE_WORKER_PORT_FD"])
        os.write(fd, (json.dumps(said) + "\n").encode())
        os.close(fd)

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
    from ground import eventloop
    from ground.serving import exit_after
    from ground.settings import RouterSettings

    parsed = RouterSettings(**settings)
    eventloop.run(exit_after(_serve(parsed)), parsed.event_loop)


if __name__ == "__main__":
    main()
