"""Heartbeats: a hostd publishes its HostStatus to Redis every interval with a TTL, so routers discover it
and a hostd that stops (crash, SIGKILL, partition) drops out within the TTL. On drain it deletes its entry
at once, so routers stop sending it new work while its in-flight requests finish.

Redis keys: the heartbeat schema in ground/wire.py.
Redis errors are logged and retried at the next interval; they never stop the hostd.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from ground.settings import HeartbeatSettings
from ground.wire import heartbeat_index_key as index_key
from ground.wire import heartbeat_status_key as status_key
from protos import hostd_control_pb2 as hc

log = logging.getLogger(__name__)


class Heartbeat:
    def __init__(self, status_fn: Callable[[], hc.HostStatus], settings: HeartbeatSettings) -> None:
        import redis.asyncio as aredis

        assert settings.redis_url
        self.settings = settings
        self._status = status_fn
        self._r = aredis.Redis.from_url(settings.redis_url, socket_timeout=2, socket_connect_timeout=2)
        self._task: asyncio.Task | None = None
        self._host_id: str | None = None
        self.beats = 0

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="heartbeat")

    async def beat(self) -> None:
        s = self._status()
        if self.settings.advertise:
            s.address = self.settings.advertise
        self._host_id = s.host_id
        p = self.settings.prefix
        pipe = self._r.pipeline(transaction=False)
        pipe.set(status_key(p, s.host_id), s.SerializeToString(), px=int(self.settings.ttl_s * 1000))
        pipe.sadd(index_key(p), s.host_id)
        await pipe.execute()
        self.beats += 1

    async def _run(self) -> None:
        failing = False
        while True:
            try:
                await self.beat()
                if failing:
                    log.info("heartbeats to %s resumed", self.settings.redis_url)
                failing = False
            except Exception as e:  # noqa: BLE001 - Redis down must not stop the hostd
                if not failing:
                    log.warning("heartbeat to %s failed (retrying every %.1fs): %s", self.settings.redis_url,
                                self.settings.interval_s, e)
                failing = True
            await asyncio.sleep(self.settings.interval_s)

    async def stop(self) -> None:
        """Stop beating and remove this host's entry, so routers drop it now rather than after the TTL."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        try:
            if self._host_id is not None:
                p = self.settings.prefix
                await self._r.delete(status_key(p, self._host_id))
                await self._r.srem(index_key(p), self._host_id)
        except Exception as e:  # noqa: BLE001
            log.warning("could not remove heartbeat entry: %s", e)
        await self._r.aclose()
