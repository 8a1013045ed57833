"""Drive ModelStreamInfer with Triton's own client library (tritonclient.grpc's start_stream /
async_stream_infer and the asyncio client's stream_infer), in a subprocess: its protobuf registry and ours
cannot share a process. Shared by tests/router/test_streaming.py and tests/hostd/test_streaming.py."""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = r"""
import asyncio, json, queue, sys, threading, time
import numpy as np
import tritonclient.grpc as g
import tritonclient.grpc.aio as ga
from tritonclient.utils import InferenceServerException

cfg = json.loads(sys.argv[1])
addr, headers, dim, scenario = cfg["addr"], cfg.get("headers"), cfg["dim"], cfg["scenario"]
x = np.arange(2 * dim, dtype=np.float32).reshape(2, dim) / (2 * dim)

def inp(mod):
    i = mod.InferInput("input", [2, dim], "FP32"); i.set_data_from_numpy(x); return i

def err(e):
    return [str(e.status()), e.message()]

def stream(models, **kw):
    # one start_stream, one async_stream_infer per model (ids r0, r1, ...): {id: output}, [errors]
    q = queue.Queue()
    c = g.InferenceServerClient(addr)
    c.start_stream(callback=lambda result, error: q.put((result, error)), headers=headers, **kw)
    for k, m in enumerate(models):
        c.async_stream_infer(m, [inp(g)], request_id=f"r{k}")
    res, errs = {}, []
    for _ in models:
        r, e = q.get(timeout=60)
        if e is not None:
            errs.append(err(e))
        else:
            res[r.get_response().id] = r.as_numpy("output").tolist()
    c.stop_stream(); c.close()
    return {"results": res, "errors": errs}

def unary():
    c = g.InferenceServerClient(addr)
    r = c.infer(cfg["model"], [inp(g)], headers=headers)
    c.close()
    return r.as_numpy("output").tolist()

async def aio_stream(n, tag):
    c = ga.InferenceServerClient(addr)
    async def reqs():
        for k in range(n):
            yield {"model_name": cfg["model"], "inputs": [inp(ga)], "request_id": f"{tag}-{k}"}
    res, errs = {}, []
    async for r, e in c.stream_infer(reqs(), headers=headers):
        if e is not None:
            errs.append(err(e))
        else:
            res[r.get_response().id] = r.as_numpy("output").tolist()
        if len(res) + len(errs) == n:
            break
    await c.close()
    return {"results": res, "errors": errs}

if scenario == "stream":
    out = stream(cfg["models"])
elif scenario == "refused":  # the first answer on a stream (an error for a refused stream)
    q = queue.Queue()
    c = g.InferenceServerClient(addr)
    c.start_stream(callback=lambda result, error: q.put((result, error)), headers=headers)
    try:
        c.async_stream_infer(cfg["model"], [inp(g)], request_id="r0")
    except InferenceServerException:  # the refusal came first (the server refuses on open): it is in the queue
        pass
    r, e = q.get(timeout=30)
    out = {"error": err(e) if e is not None else None}
    c.stop_stream(); c.close()
elif scenario == "deadline":  # answers, then the stream's deadline passes
    q = queue.Queue()
    c = g.InferenceServerClient(addr)
    c.start_stream(callback=lambda result, error: q.put((result, error)), headers=headers,
                   stream_timeout=cfg["stream_timeout"])
    for k in range(3):
        c.async_stream_infer(cfg["model"], [inp(g)], request_id=f"r{k}")
    got, t0 = [], time.monotonic()
    while time.monotonic() - t0 < cfg["stream_timeout"] + 10:
        try:
            r, e = q.get(timeout=1)
        except queue.Empty:
            continue
        got.append(err(e) if e is not None else r.get_response().id)
        if e is not None:
            break
    c.stop_stream(); c.close()
    out = {"got": got, "unary": unary()}
elif scenario == "cancel":  # many requests in flight, then the client cancels the stream
    c = g.InferenceServerClient(addr)
    c.start_stream(callback=lambda result, error: None, headers=headers)
    for k in range(cfg["n"]):
        c.async_stream_infer(cfg["model"], [inp(g)], request_id=f"r{k}")
    time.sleep(cfg.get("wait", 0.05))
    c.stop_stream(cancel_requests=True); c.close()
    out = {"unary": unary()}
elif scenario == "aio":
    async def main():
        return await asyncio.gather(*(aio_stream(cfg["n"], f"s{s}") for s in range(cfg["streams"])))
    out = {"streams": asyncio.run(main())}
elif scenario == "load":  # concurrent sync streams, one client (and thread) each
    outs = [None] * cfg["streams"]
    def run(s):
        outs[s] = stream([cfg["model"]] * cfg["n"])
    ts = [threading.Thread(target=run, args=(s,)) for s in range(cfg["streams"])]
    [t.start() for t in ts]; [t.join() for t in ts]
    out = {"streams": outs}
out["want"] = x.tolist()
print(json.dumps(out))
"""


def run(addr: str, scenario: str, *, dim: int, key: str | None = None, timeout: float = 120, **kw) -> dict:
    """Run one scenario of SCRIPT against `addr` (with `key` as a Bearer API key) and return its JSON."""
    cfg = {"addr": addr, "scenario": scenario, "dim": dim, **kw}
    if key is not None:
        cfg["headers"] = {"authorization": f"Bearer {key}"}
    p = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(cfg)], capture_output=True, text=True,
                       timeout=timeout)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout)
