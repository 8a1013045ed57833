"""Models imported from a Triton repository serve: one real hostd on the store, one ONNX and one TorchScript
model inferred over gRPC and compared with their references."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

from mmhost.demo_models import torch_reference
from protos import grpc_service_pb2 as pb
from tests.hostd_proc import HostdProc
from tests.storage.conftest import make_bucket


def _infer(h: HostdProc, model: str, name: str, x: np.ndarray, version: str = "") -> np.ndarray:
    r = pb.ModelInferRequest(model_name=model, model_version=version)
    r.inputs.add(name=name, datatype="FP32", shape=list(x.shape))
    r.raw_input_contents.append(x.tobytes())
    resp = h.stub.ModelInfer(r, timeout=60)
    return np.frombuffer(resp.raw_output_contents[0], np.float32).reshape(list(resp.outputs[0].shape))


def test_imported_models_serve(cli, s3_server, triton_repo_good, tmp_path):
    store = f"s3://{make_bucket(s3_server.endpoint)}/models"
    r = cli("import", "triton", "--store", store, "--tenant", "demo", triton_repo_good)
    assert r.exit_code == 0, r.output

    h = HostdProc(store, tmp_path / "hostd", env={"MMHOST_S3_ENDPOINT_URL": s3_server.endpoint})
    try:
        x = np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32)
        want = ort.InferenceSession(str(triton_repo_good / "mlp" / "2" / "model.onnx"),
                                    providers=["CPUExecutionProvider"]).run(["output"], {"input": x})[0]
        np.testing.assert_allclose(_infer(h, "mlp", "input", x), want, rtol=1e-5, atol=1e-5)  # latest: version 2

        x = np.random.default_rng(1).standard_normal((5, 16)).astype(np.float32)
        np.testing.assert_allclose(_infer(h, "ts", "INPUT__0", x), torch_reference(x), rtol=1e-5, atol=1e-6)
    finally:
        h.stop()
