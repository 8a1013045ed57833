"""Fixtures for the mmhost command tests: the storage tests' moto buckets and demo models, and a Triton model
repository built from real small models (ONNX and TorchScript), with the kinds of model that must be refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.storage.conftest import bucket, cli, demo_files, s3_settings, s3_uri  # noqa: F401  (fixtures)

MLP_CONFIG = """
name: "mlp"
platform: "onnxruntime_onnx"
max_batch_size: 16
input [ { name: "input" data_type: TYPE_FP32 dims: [ 64 ] } ]
output [ { name: "output", data_type: TYPE_FP32, dims: [ 10 ] } ]
dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 100
  priority_levels: 2
  default_priority_level: 2
  default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 5000 allow_timeout_override: true
                         max_queue_size: 4 }
}
instance_group [ { count: 2 kind: KIND_GPU }, { count: 1 kind: KIND_CPU } ]
version_policy: { all { } }
model_warmup [ { name: "zeros" batch_size: 1
                 inputs { key: "input" value { data_type: TYPE_FP32 dims: [ 64 ] zero_data: true } } } ]
"""
# No signature: read from the ONNX file. No version_policy: Triton serves the latest version only.
MLP_AUTO_CONFIG = 'backend: "onnxruntime"\nmax_batch_size: 8\ndynamic_batching { }\n'
TS_CONFIG = """
name: "ts"
backend: "pytorch"
max_batch_size: 8
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 4 ] } ]
dynamic_batching { max_queue_delay_microseconds: 500 }
instance_group [ { count: 2 } ]
"""
# Not batching: Triton's dims are the full shape. A file name of its own.
TS_PLAIN_CONFIG = """
platform: "pytorch_libtorch"
default_model_filename: "net.pt"
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ -1, 16 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ -1, 4 ] } ]
"""
ENSEMBLE_CONFIG = """
name: "ens"
platform: "ensemble"
max_batch_size: 16
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 64 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 10 ] } ]
ensemble_scheduling { step [ { model_name: "mlp" model_version: -1
                               input_map { key: "input" value: "IN" } output_map { key: "output" value: "OUT" } } ] }
"""
PYTHON_CONFIG = """
name: "pre"
backend: "python"
input [ { name: "IN" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 64 ] } ]
"""
SEQUENCE_CONFIG = 'backend: "onnxruntime"\nmax_batch_size: 4\nsequence_batching { max_sequence_idle_microseconds: 5000000 }\n'

GOOD = ("mlp", "mlp_auto", "ts", "ts_plain")
REFUSED = {"ens": "ensemble", "pre": "backend 'python'", "seq": "sequence_batching"}


def build_triton_repo(root: Path, with_refused: bool = True) -> Path:
    from mmhost.demo_models import build_onnx_mlp, build_torchscript

    def model(name: str, config: str, files: dict[str, object]) -> None:
        (root / name).mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(config)
        for rel, build in files.items():
            path = root / name / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            build(path)

    model("mlp", MLP_CONFIG, {"1/model.onnx": build_onnx_mlp, "2/model.onnx": lambda p: build_onnx_mlp(p, seed=1)})
    model("mlp_auto", MLP_AUTO_CONFIG, {f"{v}/model.onnx": lambda p, v=v: build_onnx_mlp(p, seed=v) for v in (1, 2, 3)})
    model("ts", TS_CONFIG, {"1/model.pt": build_torchscript})
    model("ts_plain", TS_PLAIN_CONFIG, {"4/net.pt": build_torchscript})
    if with_refused:
        model("ens", ENSEMBLE_CONFIG, {"1/.keep": lambda p: p.write_text("")})
        model("pre", PYTHON_CONFIG, {"1/model.py": lambda p: p.write_text("class TritonPythonModel: pass\n")})
        model("seq", SEQUENCE_CONFIG, {"1/model.onnx": build_onnx_mlp})
    return root


@pytest.fixture(scope="session")
def triton_repo(tmp_path_factory) -> Path:
    return build_triton_repo(tmp_path_factory.mktemp("triton") / "models")


@pytest.fixture(scope="session")
def triton_repo_good(tmp_path_factory) -> Path:
    return build_triton_repo(tmp_path_factory.mktemp("triton-good") / "models", with_refused=False)
