"""Cold start from S3, measured in one run: for a ~50 MB ONNX model (MLP 256-3500-3500-10) in an
S3-compatible store (a moto_server process started here), time
  (a) a plain boto3 GET of the object to a local file,
  (b) building the ONNX Runtime session from that file,
  (c) hostd's first request for the model: catalog lookup, fetch, sha256 verify, load, warm-up, inference,
and print (c) / ((a) + (b)). Target: <= 1.25.

    .venv/bin/python bench/cold_start.py [--dims 256,3500,3500,10]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from bench._common import s3_with_model  # noqa: E402

from mmhost.demo_models import build_onnx_mlp  # noqa: E402
from tests.hostd_proc import HostdProc  # noqa: E402  (starts `mmhost hostd` as a process)

TARGET = 1.25


def load_phases(metrics: str) -> dict[str, float]:
    """Seconds per load phase from hostd's mmhost_model_load_duration_seconds histogram (one load)."""
    out = {}
    for line in metrics.splitlines():
        if line.startswith("mmhost_model_load_duration_seconds_sum{"):
            phase = line.split('phase="', 1)[1].split('"', 1)[0]
            out[phase] = float(line.rsplit(" ", 1)[1])
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dims", default="256,3500,3500,10", help="MLP layer sizes")
    a = ap.parse_args()
    dims = tuple(int(d) for d in a.dims.split(","))
    from protos import grpc_service_pb2 as pb

    req = pb.ModelInferRequest(model_name="mlp")
    x = np.zeros((1, dims[0]), np.float32)
    req.inputs.add(name="input", datatype="FP32", shape=list(x.shape))
    req.raw_input_contents.append(x.tobytes())

    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        work = Path(tmp)
        model_path = work / "mlp.onnx"
        build_onnx_mlp(model_path, dims)
        size = model_path.stat().st_size
        s3 = stack.enter_context(s3_with_model(model_path))
        print(f"model: ONNX MLP {'-'.join(map(str, dims))}, {size / 1e6:.1f} MB, at {s3.store} on {s3.endpoint}")

        # (a) a plain boto3 GET of the object into a file
        dest = work / "get.onnx"
        t0 = time.perf_counter()
        body = s3.client.get_object(Bucket=s3.bucket, Key=s3.key)["Body"]
        with open(dest, "wb") as f:
            for chunk in body.iter_chunks(1 << 20):
                f.write(chunk)
        t_get = time.perf_counter() - t0
        assert dest.stat().st_size == size

        # (b) the runtime session from the file
        import onnxruntime as ort

        t0 = time.perf_counter()
        so = ort.SessionOptions()
        so.inter_op_num_threads = 1
        ort.InferenceSession(str(dest), so, providers=["CPUExecutionProvider"])
        t_session = time.perf_counter() - t0

        # (c) hostd's first request for the model (hostd is started and serving before the clock starts)
        hostd = HostdProc(s3.store, work / "hostd", env={"MMHOST_S3_ENDPOINT_URL": s3.endpoint},
                          args=["--ort-threads", "0"])  # runtime default threads, as in (b)
        stack.callback(hostd.stop)
        t0 = time.perf_counter()
        hostd.stub.ModelInfer(req, timeout=120)
        t_first = time.perf_counter() - t0
        t0 = time.perf_counter()
        hostd.stub.ModelInfer(req, timeout=120)
        t_warm = time.perf_counter() - t0
        phases = load_phases(hostd.metrics_text())

    ratio = t_first / (t_get + t_session)
    print(f"(a) boto3 GET to file        {t_get * 1000:8.1f} ms  ({size / t_get / 1e6:.0f} MB/s)")
    print(f"(b) ORT session from file    {t_session * 1000:8.1f} ms")
    print(f"(c) hostd first request      {t_first * 1000:8.1f} ms  (a warm request after it: {t_warm * 1000:.1f} ms)")
    print("    hostd's load phases: " + ", ".join(f"{k} {v * 1000:.1f} ms" for k, v in phases.items())
          + f"; outside the load: {(t_first - sum(phases.values())) * 1000:.1f} ms")
    print(f"(c) / ((a) + (b)) = {ratio:.2f}   target <= {TARGET}: {'ok' if ratio <= TARGET else 'MISSED'}")


if __name__ == "__main__":
    main()
