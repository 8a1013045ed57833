"""Two kinds of tenant load over raw gRPC (so refusals' status, message and trailing `retry-after-ms` are
visible), shared by bench/noisy_neighbor.py and tests/isolation:
- steady: one request at a time at a fixed pace (a light, well-behaved tenant), latencies recorded;
- open_loop: requests sent at a fixed rate whatever the answers (a tenant far over its quota)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field

import grpc
import numpy as np


@dataclass
class Outcomes:
    latencies: list[float] = field(default_factory=list)  # seconds, OK answers only
    codes: Counter = field(default_factory=Counter)  # status name -> count
    reasons: Counter = field(default_factory=Counter)  # refusal message prefix (before ':') -> count
    retry_after_ms: list[int | None] = field(default_factory=list)  # one per refusal
    errors: list[str] = field(default_factory=list)  # first few non-OK answers, for messages

    @property
    def refused(self) -> int:
        return sum(n for c, n in self.codes.items() if c != "OK")

    def pct(self, q: float) -> float:
        return float(np.percentile(np.array(self.latencies) * 1000, q)) if self.latencies else float("nan")


async def _one(stub, request, metadata, out: Outcomes, timeout: float | None) -> None:
    t0 = time.perf_counter()
    try:
        await stub.ModelInfer(request, metadata=metadata, timeout=timeout)
    except grpc.aio.AioRpcError as e:
        out.codes[e.code().name] += 1
        out.reasons[(e.details() or "").split(":", 1)[0]] += 1
        ra = dict(e.trailing_metadata() or ()).get("retry-after-ms")
        out.retry_after_ms.append(int(ra) if ra is not None else None)
        if len(out.errors) < 5:
            out.errors.append(f"{e.code().name}: {e.details()}")
        return
    out.codes["OK"] += 1
    out.latencies.append(time.perf_counter() - t0)


async def steady(stub, request, metadata, seconds: float, interval_s: float, timeout: float | None = 30) -> Outcomes:
    out = Outcomes()
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        await _one(stub, request, metadata, out, timeout)
        await asyncio.sleep(max(0.0, interval_s - (time.perf_counter() - t0)))
    return out


async def open_loop(stub, request, metadata, rate: float, seconds: float, timeout: float | None = 30) -> Outcomes:
    out = Outcomes()
    tasks = []
    start = time.perf_counter()
    n = int(rate * seconds)
    for i in range(n):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(_one(stub, request, metadata, out, timeout)))
    await asyncio.gather(*tasks)
    return out
