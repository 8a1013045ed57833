"""hostd's tenant limits from the Redis registry survive a Redis that lost its data: while the registry's
`ready` marker is absent, the last limits read while it was present are kept (a FLUSHALL does not reset
every tenant's weight and device share to the defaults). Real redis-server."""

from __future__ import annotations

import asyncio
import json
import uuid

import redis

from hostd.tenants import RedisLimits


def test_limits_outlive_a_flush_until_the_registry_is_rebuilt(redis_server):
    prefix = f"t-{uuid.uuid4().hex[:8]}:"
    r = redis.Redis.from_url(redis_server.url, decode_responses=True)
    r.hset(f"{prefix}by-name", "acme", json.dumps({"limits": {"tier": "premium"}}))
    r.hset(f"{prefix}ready", "at", "now")

    async def run() -> None:
        src = RedisLimits(redis_server.url, prefix)
        try:
            before = await src.read()
            assert before["acme"].tier == "premium"
            r.delete(f"{prefix}by-name", f"{prefix}ready")  # what FLUSHALL does to these keys
            assert (await src.read())["acme"].tier == "premium", "kept while the index is not whole"
            r.hset(f"{prefix}by-name", "beta", json.dumps({"limits": {"tier": "free"}}))
            kept = await src.read()
            assert kept["acme"].tier == "premium" and kept["beta"].tier == "free"
            r.hset(f"{prefix}ready", "at", "later")  # rebuilt: Redis's set is the truth again
            assert set(await src.read()) == {"beta"}
        finally:
            await src.close()

    asyncio.run(run())
