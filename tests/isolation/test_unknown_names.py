"""20,000 distinct unknown model names through a real router (and 5,000 at its hostd directly)
leave memory where it was: unknown names are remembered in bounded LRUs (router/directory.py,
hostd/catalog_view.py) and names that cannot be names are never remembered at all. RSS is measured before
and after, once the caches are full (warm-up), and must grow by less than 10 MB."""

from __future__ import annotations

import asyncio

import grpc
import psutil

from ground.wire import TENANT_HEADER
from protos import grpc_service_pb2 as pb
from tests.isolation.conftest import auth

MB = 1 << 20


async def _ask(addr: str, md, names: list[str], concurrency: int = 16) -> set[str]:
    codes: set[str] = set()
    async with grpc.aio.insecure_channel(addr) as ch:
        call = ch.unary_unary("/inference.GRPCInferenceService/ModelMetadata")
        it = iter(names)

        async def worker() -> None:
            for name in it:
                try:
                    await call(pb.ModelMetadataRequest(name=name).SerializeToString(), metadata=md, timeout=30)
                    codes.add("OK")
                except grpc.aio.AioRpcError as e:
                    codes.add(e.code().name)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return codes


def _growth(proc, addr: str, md, tag: str, n: int) -> int:
    rss = psutil.Process(proc.proc.pid)
    # warm-up: fill the caches (4096 unknown names each) and the allocator's pools
    assert asyncio.run(_ask(addr, md, [f"warm-{tag}-{i}" for i in range(5000)])) == {"NOT_FOUND"}
    before = rss.memory_info().rss
    names = [f"unknown-{tag}-{i}" for i in range(n)]
    names += [f"not a name/{i}" + "x" * 200 for i in range(0, n, 10)]  # never looked up, never cached
    assert asyncio.run(_ask(addr, md, names)) == {"NOT_FOUND"}
    grew = rss.memory_info().rss - before
    print(f"{proc.role}: RSS {before / MB:.1f} MiB -> +{grew / MB:.1f} MiB after {len(names)} unknown names")
    return grew


def test_unknown_names_through_a_router_cost_no_lasting_memory(isolated):
    grew = _growth(isolated.router, isolated.router.addr, auth(isolated.keys["light"]), "r", 20_000)
    assert grew < 10 * MB
    assert isolated.router.proc.poll() is None


def test_unknown_names_at_a_hostd_cost_no_lasting_memory(isolated):
    grew = _growth(isolated.hostd, isolated.hostd.addr, ((TENANT_HEADER, "light"),), "h", 5_000)
    assert grew < 10 * MB
