"""What starting a child the router's way costs: a trivial worker (echoes 1,000 bytes of stdin) started and
answered on uvloop, by asyncio's create_subprocess_exec (which forks the process and runs its at-fork hooks:
the way router/uploads.py started its validation worker before ground/async_child.py) and by
ground.async_child.start (Popen, vfork), alternating, in one run.

    python -m bench.child_start [--rounds 60]"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ground import async_child  # noqa: E402

ARGV = (sys.executable, "-S", "-c", "import sys; sys.stdout.write(sys.stdin.read())")
DATA = b"x" * 1000


async def forked() -> None:
    p = await asyncio.create_subprocess_exec(  # noqa: TID251 - the way measured against
        *ARGV, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env={})
    out, _ = await p.communicate(DATA)
    assert out == DATA


async def vforked() -> None:
    p = await async_child.start(ARGV, {})
    p.stdin.write(DATA)
    await p.stdin.drain()
    p.stdin.close()
    out = await p.stdout.read()
    await p.stderr.read()
    await p.wait()
    assert out == DATA


async def main(rounds: int) -> None:
    ways = {"create_subprocess_exec": forked, "async_child.start": vforked}
    ms: dict[str, list[float]] = {name: [] for name in ways}
    for i in range(rounds):
        for name in (list(ways) if i % 2 == 0 else list(ways)[::-1]):
            t0 = time.perf_counter()
            await ways[name]()
            ms[name].append((time.perf_counter() - t0) * 1e3)
    for name, v in ms.items():
        v.sort()
        print(f"{name:<24} median {statistics.median(v):6.2f} ms  p90 {v[int(len(v) * 0.9)]:6.2f} ms  ({len(v)} starts)")


if __name__ == "__main__":
    import uvloop

    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=60)
    uvloop.run(main(ap.parse_args().rounds))
