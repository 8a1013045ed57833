"""Byte storms, long versions: `concurrency` clients of one tenant sending `mib`-MiB requests back to back
through a router in front of one hostd, beside a calm tenant's small requests (one every 20 ms), with the
shipped byte budgets (router 256 MiB in flight, hostd 512 MiB; a tenant a quarter of each). Measures the calm
tenant's p99 alone and during the storm, and each process's RSS: start, peak, and peak growth against its
in-flight budget. tests/isolation/test_bytes_inflight.py is the bounded version.

    python -m bench.storms [--seconds 6]     (bench/chaos.py runs it for its table)"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import psutil

from bench._tenants import Outcomes, steady
from catalog.publish import publish_version
from catalog.repository import ModelRepository
from ground.units import parse_bytes
from ground.wire import REASON, RETRY_AFTER
from mmhost.demo_models import build_onnx_mlp, onnx_manifest
from protos import grpc_service_pb2 as pb
from protos import grpc_service_pb2_grpc
from router.tenants import FileTenants
from storage_adapters.local import LocalStorage
from tests.hostd_proc import HostdProc
from tests.isolation.conftest import FAST_DIMS, auth, fast_request
from tests.router.router_proc import RouterProc

MiB = 1 << 20
ROWS = 32  # the default max_batch_size
BIG = [("grpc.max_send_message_length", 256 * MiB), ("grpc.max_receive_message_length", 256 * MiB)]
ROUTER_BUDGET, HOSTD_BUDGET = "256MiB", "512MiB"  # the shipped defaults (ground/settings.py)


@dataclass
class StormResult:
    name: str
    codes: Counter
    odd: list[str]
    calm_alone: Outcomes
    calm_storm: Outcomes
    rss: list[tuple[int, int]]  # (start, peak) MiB: router, hostd

    @property
    def requests(self) -> int:
        return sum(self.codes.values()) + sum(self.calm_storm.codes.values())

    @property
    def failed(self) -> int:
        return sum(n for c, n in self.codes.items() if c != "OK") + self.calm_storm.refused

    @property
    def bad(self) -> int:
        """Failures that should not happen: the calm tenant's, and any storm answer but OK or a budget refusal."""
        return self.calm_storm.refused + sum(n for c, n in self.codes.items()
                                             if c not in ("OK", "RESOURCE_EXHAUSTED/inflight_bytes"))

    def growth_ok(self) -> bool:
        (r0, r1), (h0, h1) = self.rss[:2]  # router, hostd (HAProxy, when there, is printed beside)
        return r1 - r0 <= parse_bytes(ROUTER_BUDGET) // MiB and h1 - h0 <= parse_bytes(HOSTD_BUDGET) // MiB

    def p99_ratio(self) -> float:
        return self.calm_storm.pct(99) / self.calm_alone.pct(99)


def _request(model: str, dim: int) -> bytes:
    x = np.random.default_rng(2).random((ROWS, dim), dtype=np.float32)
    return pb.ModelInferRequest(model_name=model, inputs=[pb.ModelInferRequest.InferInputTensor(
        name="input", datatype="FP32", shape=[ROWS, dim])], raw_input_contents=[x.tobytes()]).SerializeToString()


async def storm(addr: str, md, body: bytes, concurrency: int, seconds: float,
                timeout: float = 120) -> tuple[Counter, list[str], int]:
    """`concurrency` clients sending `body` back to back, each sleeping `retry-after-ms` after a budget refusal:
    status counts ('CODE/reason'), the first odd answers, and how many refusals carried retry-after-ms."""
    codes: Counter = Counter()
    odd: list[str] = []
    hints = 0
    async with grpc.aio.insecure_channel(addr, options=BIG) as ch:
        call = ch.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds

        async def client() -> None:
            nonlocal hints
            while loop.time() < end:
                try:
                    await call(body, metadata=md, timeout=timeout)
                    codes["OK"] += 1
                except grpc.aio.AioRpcError as e:
                    t = dict(e.trailing_metadata() or ())
                    codes[f"{e.code().name}/{t.get(REASON)}"] += 1
                    if e.code() is grpc.StatusCode.RESOURCE_EXHAUSTED and RETRY_AFTER in t:
                        hints += 1
                        await asyncio.sleep(int(t[RETRY_AFTER]) / 1000)
                    elif len(odd) < 5:
                        odd.append(f"{e.code().name}: {e.details()}")

        await asyncio.gather(*(client() for _ in range(concurrency)))
    return codes, odd, hints


def rss_mb(pid: int, key: str = "VmRSS") -> float:
    """A process's resident memory in MiB from /proc/PID/status: now (VmRSS) or its peak (VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


class PeakRss:
    """The largest RSS of some processes between start and stop, as the kernel tracks it: the peak (VmHWM) is
    reset to the current RSS at start (writing 5 to /proc/PID/clear_refs) and read at stop."""

    def __init__(self, *pids: int) -> None:
        self.pids = pids
        for p in pids:
            Path(f"/proc/{p}/clear_refs").write_text("5")
        self.start = [int(rss_mb(p)) for p in pids]

    def stop(self) -> list[tuple[int, int]]:
        """(start, peak) MiB per process."""
        return [(a, int(rss_mb(p, "VmHWM"))) for a, p in zip(self.start, self.pids, strict=True)]


def calm_thread(addr: str, md, seconds: float, out: list) -> threading.Thread:
    async def go() -> Outcomes:
        async with grpc.aio.insecure_channel(addr) as ch:
            return await steady(grpc_service_pb2_grpc.GRPCInferenceServiceStub(ch), fast_request(), md,
                                seconds, interval_s=0.02)

    t = threading.Thread(target=lambda: out.append(asyncio.run(go())), daemon=True)
    t.start()
    return t


def _calm_proc(addr: str, md, seconds: float, q) -> None:
    box: list[Outcomes] = []
    calm_thread(addr, md, seconds, box).join(seconds + 60)
    q.put(box[0])


def calm_elsewhere(addr: str, md, seconds: float):
    """The calm tenant's client in a process of its own: in the storm's process it would wait for the GIL
    behind the storm's client, and its latency would be the client's, not the servers'."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_calm_proc, args=(addr, md, seconds, q), daemon=True)
    p.start()
    return p, q


def run_storms(storms: list[tuple[int, int]], seconds: float, fast_lane: bool = False) -> list[StormResult]:
    """One router + hostd per storm size (`(concurrency, mib)`): a fresh process's RSS for each. `fast_lane`: the
    router with fast_lane=haproxy (the calm tenant's small calls go straight to hostd, the storm's large bodies
    through the router's Python lane and its byte budget); HAProxy's own RSS is printed beside."""
    out = []
    with tempfile.TemporaryDirectory() as d:
        for concurrency, mib in storms:
            work = Path(d) / f"s{concurrency}x{mib}"
            work.mkdir()
            dim = mib * MiB // (4 * ROWS)
            store = work / "store"
            repo = ModelRepository(LocalStorage(store))
            build_onnx_mlp(work / "wide.onnx", (dim, 4, 4))
            build_onnx_mlp(work / "fast.onnx", FAST_DIMS)
            publish_version(repo, onnx_manifest("stormy", "wide", "1", work / "wide.onnx", "model.onnx"),
                            {"model.onnx": work / "wide.onnx"})
            publish_version(repo, onnx_manifest("calm", "fast", "1", work / "fast.onnx", "model.onnx"),
                            {"model.onnx": work / "fast.onnx"})
            reg = FileTenants(work / "tenants.json")
            keys = {t: reg.create(t, "unlimited") for t in ("stormy", "calm")}
            h = HostdProc(str(store), work, args=["--tenant-limits", str(work / "tenants.json")], tenant="nobody",
                          env={"MMHOST_HOSTD_INFLIGHT_BYTES": HOSTD_BUDGET})
            lane = ["--fast-lane", "haproxy", "--refresh-interval", "0.2"] if fast_lane else []
            r = RouterProc(work, ["--hosts", h.addr, "--tenants", str(work / "tenants.json"), "--store", str(store),
                                  *lane], env={"MMHOST_ROUTER_INFLIGHT_BYTES": ROUTER_BUDGET})
            try:
                body = _request("wide", dim)
                stormy, calm = auth(keys["stormy"]), auth(keys["calm"])
                asyncio.run(storm(r.addr, stormy, body, 1, 0.01))  # loads the wide model
                alone: list[Outcomes] = []
                if fast_lane:  # the calm model loaded, then READY in the router's view: routed from here on
                    calm_thread(r.addr, calm, 0.5, []).join(30)
                    time.sleep(1.0)
                calm_thread(r.addr, calm, seconds, alone).join(seconds + 30)
                rss = PeakRss(r.proc.pid, h.proc.pid, *[c.pid for c in psutil.Process(r.proc.pid).children()])
                p, q = calm_elsewhere(r.addr, calm, seconds + 0.5)
                codes, odd, _ = asyncio.run(storm(r.addr, stormy, body, concurrency, seconds))
                during = q.get(timeout=120)
                p.join(30)
                res = StormResult(f"{concurrency} x {mib} MB storm", codes, odd, alone[0], during, rss.stop())
                print(f"  {res.name}: storm {dict(codes)}; calm p99 alone {res.calm_alone.pct(99):.1f} ms, "
                      f"during {res.calm_storm.pct(99):.1f} ms; RSS MiB (start, peak) router {res.rss[0]}, "
                      f"hostd {res.rss[1]}" + (f", HAProxy {res.rss[2]}" if len(res.rss) > 2 else ""), flush=True)
                for o in odd:
                    print("    odd:", o)
                out.append(res)
            finally:
                r.stop()
                h.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--fast-lane", action="store_true", help="the router with fast_lane=haproxy")
    a = ap.parse_args()
    for s in run_storms([(64, 8), (16, 60)], a.seconds, a.fast_lane):
        print(f"{s.name}: growth within budgets {s.growth_ok()}, calm p99 x{s.p99_ratio():.2f} (target <= 2), "
              f"bad answers {s.bad}")


if __name__ == "__main__":
    main()
