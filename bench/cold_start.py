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
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import boto3  # noqa: E402
import numpy as np  # noqa: E402

from mmhost.demo_models import build_onnx_mlp  # noqa: E402
from mmhost.settings import S3Settings  # noqa: E402
from mmhost.upload import UploadRequest, upload  # noqa: E402
from storage_adapters.factory import open_storage  # noqa: E402
from storage_adapters.repository import ModelRepository  # noqa: E402
from tests.hostd_proc import HostdProc  # noqa: E402  (starts `mmhost hostd` as a process)
from tests.servers import MotoServer  # noqa: E402

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
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    dims = tuple(int(d) for d in a.dims.split(","))

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model_path = work / "mlp.onnx"
        build_onnx_mlp(model_path, dims)
        size = model_path.stat().st_size
        srv = MotoServer()
        hostd = None
        try:
            bucket = f"bench-{uuid.uuid4().hex[:8]}"
            client = boto3.session.Session().client("s3", endpoint_url=srv.endpoint, region_name="us-east-1")
            client.create_bucket(Bucket=bucket)
            store = f"s3://{bucket}/models"
            repo = ModelRepository(open_storage(store, S3Settings(endpoint_url=srv.endpoint)))
            m = upload(repo, UploadRequest(tenant="demo", model="mlp", file=model_path))
            key = f"models/tenants/demo/models/mlp/{m.version}/{m.model_file}"
            print(f"model: ONNX MLP {'-'.join(map(str, dims))}, {size / 1e6:.1f} MB, at {store} on {srv.endpoint}")

            # (a) a plain boto3 GET of the object into a file
            dest = work / "get.onnx"
            t0 = time.perf_counter()
            body = client.get_object(Bucket=bucket, Key=key)["Body"]
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
            from protos import grpc_service_pb2 as pb

            hostd = HostdProc(store, work / "hostd", env={"MMHOST_S3_ENDPOINT_URL": srv.endpoint},
                              args=["--ort-threads", "0"])  # runtime default threads, as in (b)
            req = pb.ModelInferRequest(model_name="mlp")
            x = np.zeros((1, dims[0]), np.float32)
            req.inputs.add(name="input", datatype="FP32", shape=list(x.shape))
            req.raw_input_contents.append(x.tobytes())
            t0 = time.perf_counter()
            hostd.stub.ModelInfer(req, timeout=120)
            t_first = time.perf_counter() - t0
            t0 = time.perf_counter()
            hostd.stub.ModelInfer(req, timeout=120)
            t_warm = time.perf_counter() - t0
            phases = load_phases(hostd.metrics_text())
        finally:
            if hostd is not None:
                hostd.stop()
            srv.stop()

    ratio = t_first / (t_get + t_session)
    print(f"(a) boto3 GET to file        {t_get * 1000:8.1f} ms  ({size / t_get / 1e6:.0f} MB/s)")
    print(f"(b) ORT session from file    {t_session * 1000:8.1f} ms")
    print(f"(c) hostd first request      {t_first * 1000:8.1f} ms  (a warm request after it: {t_warm * 1000:.1f} ms)")
    print("    hostd's load phases: " + ", ".join(f"{k} {v * 1000:.1f} ms" for k, v in phases.items())
          + f"; outside the load: {(t_first - sum(phases.values())) * 1000:.1f} ms")
    print(f"(c) / ((a) + (b)) = {ratio:.2f}   target <= {TARGET}: {'ok' if ratio <= TARGET else 'MISSED'}")


if __name__ == "__main__":
    main()
