"""Triton's own client library talks to hostd unmodified (run in a subprocess: its protobuf registry and ours
cannot share a process)."""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = r"""
import json, sys, asyncio
import numpy as np
import tritonclient.grpc as g
import tritonclient.grpc.aio as ga
addr = sys.argv[1]
c = g.InferenceServerClient(addr)
out = {"live": c.is_server_live(), "ready": c.is_server_ready(), "model_ready": c.is_model_ready("mlp")}
md = c.get_model_metadata("mlp", as_json=True)
out["inputs"] = md["inputs"]
cfg = c.get_model_config("mlp", as_json=True)["config"]
out["max_batch_size"] = cfg["max_batch_size"]
x = np.arange(128, dtype=np.float32).reshape(2, 64) / 128
i = g.InferInput("input", [2, 64], "FP32"); i.set_data_from_numpy(x)
r = c.infer("mlp", [i], outputs=[g.InferRequestedOutput("output")], request_id="abc", priority=0, timeout=5_000_000)
out["y"] = r.as_numpy("output").tolist(); out["id"] = r.get_response().id
c.unload_model("exported"); c.load_model("exported")
out["index"] = sorted((m["name"], m.get("state", "")) for m in c.get_model_repository_index(as_json=True)["models"])
st = c.get_inference_statistics("mlp", as_json=True)["model_stats"][0]
out["stats_count"] = int(st["inference_stats"]["success"]["count"])
try:
    c.infer("nope", [i])
except g.InferenceServerException as e:
    out["missing"] = e.status()
async def aio():
    ac = ga.InferenceServerClient(addr)
    i = ga.InferInput("input", [2, 64], "FP32"); i.set_data_from_numpy(x)
    rs = await asyncio.gather(*(ac.infer("mlp", [i]) for _ in range(8)))
    await ac.close()
    return [r.as_numpy("output").tolist() for r in rs]
out["aio"] = asyncio.run(aio())
print(json.dumps(out))
"""


def test_triton_client_library(hostd, demo_store):
    import numpy as np
    import onnxruntime as ort

    p = subprocess.run([sys.executable, "-c", SCRIPT, hostd.addr], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout)
    assert out["live"] and out["ready"] and out["model_ready"]
    assert out["inputs"] == [{"name": "input", "datatype": "FP32", "shape": ["-1", "64"]}]
    assert out["max_batch_size"] == 32
    x = np.arange(128, dtype=np.float32).reshape(2, 64) / 128
    sess = ort.InferenceSession(str(demo_store / "tenants/demo/models/mlp/1/model.onnx"), providers=["CPUExecutionProvider"])
    want = sess.run(["output"], {"input": x})[0]
    np.testing.assert_allclose(np.array(out["y"]), want, rtol=1e-5, atol=1e-5)
    assert out["id"] == "abc"
    assert ("exported", "READY") in [tuple(t) for t in out["index"]]
    assert out["stats_count"] >= 1
    assert out["missing"] == "StatusCode.NOT_FOUND"
    for y in out["aio"]:
        np.testing.assert_allclose(np.array(y), want, rtol=1e-5, atol=1e-5)
