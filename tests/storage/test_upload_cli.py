"""`mmhost upload` and `mmhost catalog list` against a real moto_server: validation refuses bad models
before anything is written; good models of every format round-trip through S3 and run."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from hostd.runtimes.base import DeviceSpec
from hostd.runtimes.registry import load_model
from mmhost.demo_models import torch_reference
from ground.manifest import ModelFormat
from ground.settings import S3Settings
from storage_adapters.factory import open_storage
from catalog.repository import ModelRepository

TS_SIG = ["--input", "INPUT__0:FP32:-1,16", "--output", "OUTPUT__0:FP32:-1,4"]


@pytest.fixture
def repo(s3_uri, s3_server) -> ModelRepository:
    return ModelRepository(open_storage(s3_uri, S3Settings(endpoint_url=s3_server.endpoint)))


def _fetch_and_run(repo: ModelRepository, tenant: str, model: str, tmp_path: Path, x: np.ndarray) -> np.ndarray:
    m = repo.resolve(tenant, model)
    local = tmp_path / f"{model}-{m.version}" / m.model_file
    repo.storage.download(repo.file_key(m, m.model_file), local)
    entry = m.file_entry(m.model_file)
    assert local.stat().st_size == entry.size
    assert hashlib.sha256(local.read_bytes()).hexdigest() == entry.sha256
    loaded = load_model(local, m, DeviceSpec())
    try:
        return loaded.run({m.inputs[0].name: x}, [m.outputs[0].name])[m.outputs[0].name]
    finally:
        loaded.close()


def test_onnx_round_trip(cli, s3_uri, repo, demo_files, tmp_path):
    import onnxruntime as ort

    r = cli("upload", "--store", s3_uri, "--tenant", "acme", "--model", "mlp", demo_files / "mlp.onnx",
            "--uploaded-by", "alice", "--instance-count", "2")
    assert r.exit_code == 0, r.output
    assert r.stdout.strip() == "1"
    m = repo.manifest("acme", "mlp", "1")
    assert m.format is ModelFormat.ONNX and m.model_file == "model.onnx"
    assert [(t.name, t.datatype, t.shape) for t in m.inputs] == [("input", "FP32", [-1, 64])]
    assert m.max_batch_size == 32  # dynamic first dimension: batching on by default
    assert m.instance_count == 2 and m.uploaded_by == "alice" and m.uploaded_at is not None
    assert m.files[0].sha256 == hashlib.sha256((demo_files / "mlp.onnx").read_bytes()).hexdigest()

    x = np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32)
    want = ort.InferenceSession(str(demo_files / "mlp.onnx"), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    np.testing.assert_allclose(_fetch_and_run(repo, "acme", "mlp", tmp_path, x), want, rtol=1e-5)


def test_torchscript_round_trip_needs_a_stated_signature(cli, s3_uri, repo, demo_files, tmp_path):
    r = cli("upload", "--store", s3_uri, "--tenant", "acme", "--model", "ts", demo_files / "net.pt")
    assert r.exit_code == 1
    assert "--input" in r.output and "signature" in r.output
    assert list(repo.storage.list("")) == []

    r = cli("upload", "--store", s3_uri, "--tenant", "acme", "--model", "ts", demo_files / "net.pt", *TS_SIG,
            "--max-batch-size", "8", "--max-queue-delay-us", "500")
    assert r.exit_code == 0, r.output
    m = repo.manifest("acme", "ts", r.stdout.strip())
    assert m.format is ModelFormat.TORCHSCRIPT and m.max_batch_size == 8 and m.batching.max_queue_delay_us == 500
    x = np.random.default_rng(1).standard_normal((5, 16)).astype(np.float32)
    np.testing.assert_allclose(_fetch_and_run(repo, "acme", "ts", tmp_path, x), torch_reference(x), rtol=1e-5, atol=1e-6)


def test_torch_export_round_trip(cli, s3_uri, repo, demo_files, tmp_path):
    r = cli("upload", "--store", s3_uri, "--tenant", "acme", "--model", "ep", demo_files / "net.pt2")
    assert r.exit_code == 0, r.output
    m = repo.manifest("acme", "ep", "1")
    assert m.format is ModelFormat.TORCH_EXPORT
    assert [(t.name, t.shape) for t in m.inputs] == [("x", [-1, 16])]
    x = np.random.default_rng(2).standard_normal((4, 16)).astype(np.float32)
    np.testing.assert_allclose(_fetch_and_run(repo, "acme", "ep", tmp_path, x), torch_reference(x), rtol=1e-5, atol=1e-6)


def test_refuses_a_pickle(cli, s3_uri, repo, tmp_path):
    import torch

    bad = tmp_path / "model.pt"
    torch.save(torch.nn.Linear(4, 2), bad)
    r = cli("upload", "--store", s3_uri, "--tenant", "acme", "--model", "evil", bad)
    assert r.exit_code == 1
    assert "pickle" in r.output and "arbitrary code" in r.output
    assert list(repo.storage.list("")) == []


def test_refuses_an_oversize_file(cli, s3_uri, repo, demo_files):
    r = cli("upload", "--store", s3_uri, "--tenant", "acme", "--model", "big", demo_files / "mlp.onnx",
            "--max-bytes", "1000")
    assert r.exit_code == 1
    assert "over the limit of 1000 bytes" in r.output
    assert list(repo.storage.list("")) == []


def test_refuses_an_onnx_model_with_external_data(cli, s3_uri, repo, demo_files, tmp_path):
    import onnx

    split = tmp_path / "split" / "model.onnx"
    split.parent.mkdir()
    onnx.save_model(onnx.load(str(demo_files / "mlp.onnx")), str(split), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="weights.bin", size_threshold=0)
    assert (split.parent / "weights.bin").is_file()  # it loads locally, so only this check stops it
    r = cli("upload", "--store", s3_uri, "--tenant", "acme", "--model", "split", split)
    assert r.exit_code == 1
    assert "external data" in r.output and "weights.bin" in r.output
    assert list(repo.storage.list("")) == []


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_refuses_a_corrupt_onnx_file(cli, s3_uri, repo, demo_files, tmp_path, damage):
    good = (demo_files / "mlp.onnx").read_bytes()
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(good[: len(good) // 2] if damage == "truncated" else b"\x08\x07not a model at all" * 100)
    r = cli("upload", "--store", s3_uri, "--tenant", "acme", "--model", "broken", bad)
    assert r.exit_code == 1
    assert "does not load as onnx" in r.output
    assert list(repo.storage.list("")) == []


def test_refuses_a_format_mismatch_and_a_bad_batch_size(cli, s3_uri, repo, demo_files):
    r = cli("upload", "--store", s3_uri, "--tenant", "acme", "--model", "m", demo_files / "mlp.onnx",
            "--format", "torchscript")
    assert r.exit_code == 1 and "the file is onnx" in r.output
    r = cli("upload", "--store", s3_uri, "--tenant", "acme", "--model", "m", demo_files / "net.pt",
            "--input", "INPUT__0:FP32:2,16", "--output", "OUTPUT__0:FP32:2,4", "--max-batch-size", "4")
    assert r.exit_code == 1 and "dynamic first dimension" in r.output
    assert list(repo.storage.list("")) == []


def test_fixed_shape_model_does_not_batch(cli, s3_uri, repo, demo_files):
    r = cli("upload", "--store", s3_uri, "--tenant", "acme", "--model", "fixed", demo_files / "net.pt",
            "--input", "INPUT__0:FP32:2,16", "--output", "OUTPUT__0:FP32:2,4")
    assert r.exit_code == 0, r.output
    assert repo.manifest("acme", "fixed", "1").max_batch_size == 0
    r = cli("upload", "--store", s3_uri, "--tenant", "acme", "--model", "off", demo_files / "mlp.onnx",
            "--max-batch-size", "0")
    assert r.exit_code == 0, r.output
    assert repo.manifest("acme", "off", "1").max_batch_size == 0


def test_versions_number_up_and_are_immutable(cli, s3_uri, repo, demo_files):
    def up(*extra):
        return cli("upload", "--store", s3_uri, "--tenant", "acme", "--model", "mlp", demo_files / "mlp.onnx", *extra)

    assert up().stdout.strip() == "1"
    assert up("--version", "7").stdout.strip() == "7"
    assert up().stdout.strip() == "8"
    r = up("--version", "7")
    assert r.exit_code == 1 and "already exists" in r.output
    assert repo.versions("acme", "mlp") == ["1", "7", "8"]


def test_catalog_list_shows_what_is_stored(cli, s3_uri, demo_files):
    for tenant, model, f in [("acme", "mlp", "mlp.onnx"), ("acme", "mlp", "mlp2.onnx"), ("beta", "ep", "net.pt2")]:
        assert cli("upload", "--store", s3_uri, "--tenant", tenant, "--model", model, demo_files / f).exit_code == 0
    r = cli("catalog", "list", "--store", s3_uri)
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert any("acme" in ln and "mlp" in ln and "1,2" in ln and "onnx" in ln for ln in lines), r.stdout
    assert any("beta" in ln and "ep" in ln and "torch_export" in ln for ln in lines), r.stdout
    r = cli("catalog", "list", "--store", s3_uri, "--tenant", "beta")
    assert "acme" not in r.stdout and "torch_export" in r.stdout


def test_storage_down_is_a_clear_cli_error(demo_files):
    from typer.testing import CliRunner

    from mmhost.cli import app
    from tests.servers import free_port

    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens here
    r = CliRunner().invoke(app, ["upload", "--store", "s3://b/p", "--tenant", "a", "--model", "m",
                                 str(demo_files / "mlp.onnx"), "--s3-endpoint", endpoint])
    assert r.exit_code == 1
    assert endpoint in r.output and "cannot reach storage" in r.output


def test_config_file_sets_manifest_options(cli, s3_uri, repo, demo_files, tmp_path):
    cfg = tmp_path / "mlp.yaml"
    cfg.write_text(
        "max_batch_size: 16\n"
        "dynamic_batching: {max_queue_delay_us: 2000, preferred_batch_sizes: [8, 16], priority_levels: 2}\n"
        "queue_policy: {max_queue_size: 64, default_timeout_us: 500000, timeout_action: delay}\n"
        "instance_count: 3\n"
    )
    r = cli("upload", "--store", s3_uri, "--tenant", "cfg", "--model", "mlp", demo_files / "mlp.onnx", "--config", cfg)
    assert r.exit_code == 0, r.output
    m = repo.manifest("cfg", "mlp", r.stdout.strip())
    assert m.max_batch_size == 16 and m.instance_count == 3
    assert m.dynamic_batching.max_queue_delay_us == 2000 and m.dynamic_batching.preferred_batch_sizes == [8, 16]
    assert m.dynamic_batching.priority_levels == 2
    assert m.queue_policy.max_queue_size == 64 and m.queue_policy.timeout_action == "delay"
    bad = tmp_path / "bad.yaml"
    bad.write_text("max_batch_size: 4\nwarp_speed: 9\n")
    r = cli("upload", "--store", s3_uri, "--tenant", "cfg", "--model", "mlp2", demo_files / "mlp.onnx", "--config", bad)
    assert r.exit_code != 0 and "warp_speed" in r.output
    assert repo.versions("cfg", "mlp2") == []
