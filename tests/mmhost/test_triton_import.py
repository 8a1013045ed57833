"""`mmhost import triton` against a real moto_server: a Triton repository with ONNX and TorchScript models
imports in one command, with its options mapped onto the manifests; ensembles, python-backend and sequence
models are refused by name while the others import; `mmhost upload --config config.pbtxt` reads the same file."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from catalog.repository import ModelRepository
from ground.manifest import ModelFormat
from ground.settings import S3Settings
from hostd.runtimes.base import DeviceSpec
from hostd.runtimes.registry import load_model
from mmhost.demo_models import torch_reference
from storage_adapters.factory import open_storage
from tests.mmhost.conftest import GOOD, MLP_CONFIG, REFUSED, TS_CONFIG


@pytest.fixture
def repo(s3_uri, s3_server) -> ModelRepository:
    return ModelRepository(open_storage(s3_uri, S3Settings(endpoint_url=s3_server.endpoint)))


@pytest.fixture
def wide(monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # one table row per line, whatever the terminal


def _rows(stdout: str) -> dict[str, str]:
    return {line.split("│")[1].strip(): line for line in stdout.splitlines() if line.count("│") >= 4}


def test_a_repository_imports_in_one_command(cli, s3_uri, repo, triton_repo, wide, tmp_path):
    r = cli("import", "triton", "--store", s3_uri, "--tenant", "acme", triton_repo)
    assert r.exit_code == 1, r.output  # some models were refused
    rows = _rows(r.stdout)
    assert set(rows) == set(GOOD) | set(REFUSED), r.stdout
    for model, reason in REFUSED.items():
        assert "refused" in rows[model] and reason in rows[model], rows[model]
        assert repo.versions("acme", model) == []
    for model in GOOD:
        assert "imported" in rows[model], rows[model]
    assert "model_warmup ignored" in r.stderr

    # mlp: every option mapped; version_policy all: both versions, with Triton's numbers
    assert repo.versions("acme", "mlp") == ["1", "2"]
    m = repo.manifest("acme", "mlp", "2")
    assert m.format is ModelFormat.ONNX and m.max_batch_size == 16 and m.instance_count == 3
    assert m.dynamic_batching.enabled and m.dynamic_batching.max_queue_delay_us == 100
    assert m.dynamic_batching.preferred_batch_sizes == [4, 8]
    assert (m.dynamic_batching.priority_levels, m.dynamic_batching.default_priority_level) == (2, 2)
    q = m.queue_policy
    assert (q.max_queue_size, q.default_timeout_us, q.timeout_action, q.allow_timeout_override) == (4, 5000, "delay", True)
    assert [(t.name, t.shape) for t in m.inputs] == [("input", [-1, 64])]
    assert [(t.name, t.shape) for t in m.outputs] == [("output", [-1, 10])]

    # mlp_auto: no version_policy, so only the latest version, as Triton serves; the signature from the file
    assert repo.versions("acme", "mlp_auto") == ["3"]
    assert "not imported by version_policy: 1,2" in rows["mlp_auto"]
    m = repo.manifest("acme", "mlp_auto", "3")
    assert m.max_batch_size == 8 and [(t.name, t.shape) for t in m.inputs] == [("input", [-1, 64])]

    # ts: TorchScript with a stated signature, batching with a delay, two instances
    m = repo.manifest("acme", "ts", "1")
    assert m.format is ModelFormat.TORCHSCRIPT and m.max_batch_size == 8 and m.instance_count == 2
    assert m.dynamic_batching.max_queue_delay_us == 500
    assert [(t.name, t.datatype, t.shape) for t in m.inputs] == [("INPUT__0", "FP32", [-1, 16])]

    # ts_plain: default_model_filename, no batching, Triton's dims are the whole shape
    m = repo.manifest("acme", "ts_plain", "4")
    assert m.format is ModelFormat.TORCHSCRIPT and m.model_file == "model.pt" and m.max_batch_size == 0
    assert [(t.name, t.shape) for t in m.outputs] == [("OUTPUT__0", [-1, 4])]
    local = tmp_path / "model.pt"
    repo.storage.download(repo.file_key(m, m.model_file), local)
    loaded = load_model(local, m, DeviceSpec())
    try:
        x = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)
        got = loaded.run({"INPUT__0": x}, ["OUTPUT__0"])["OUTPUT__0"]
    finally:
        loaded.close()
    np.testing.assert_allclose(got, torch_reference(x), rtol=1e-5, atol=1e-6)


def test_a_clean_repository_exits_0_and_a_second_run_is_a_no_op(cli, s3_uri, repo, triton_repo_good, wide):
    r = cli("import", "triton", "--store", s3_uri, "--tenant", "acme", triton_repo_good)
    assert r.exit_code == 0, r.output
    r = cli("import", "triton", "--store", s3_uri, "--tenant", "acme", triton_repo_good)
    assert r.exit_code == 0, r.output
    assert "already stored: 1,2" in _rows(r.stdout)["mlp"], r.stdout
    assert repo.versions("acme", "mlp") == ["1", "2"]


def test_one_bad_version_is_reported_and_the_rest_imports(cli, s3_uri, repo, triton_repo_good, wide, tmp_path):
    src = tmp_path / "models"
    shutil.copytree(triton_repo_good, src)
    (src / "mlp" / "2" / "model.onnx").write_bytes(b"not an onnx model")
    (src / "ts" / "config.pbtxt").write_text(TS_CONFIG.replace("dims: [ 4 ]", "dims: [ 5 ]"))  # wrong output shape
    r = cli("import", "triton", "--store", s3_uri, "--tenant", "acme", src)
    assert r.exit_code == 1, r.output
    rows = _rows(r.stdout)
    assert "version 2:" in rows["mlp"] and repo.versions("acme", "mlp") == ["1"]
    assert "refused" in rows["ts"] and repo.versions("acme", "ts") == []
    assert repo.versions("acme", "ts_plain") == ["4"]


def test_upload_reads_a_config_pbtxt(cli, s3_uri, repo, demo_files, tmp_path):
    cfg = tmp_path / "config.pbtxt"
    cfg.write_text(MLP_CONFIG)
    r = cli("upload", "--store", s3_uri, "--tenant", "cfg", "--model", "mlp", demo_files / "mlp.onnx", "--config", cfg)
    assert r.exit_code == 0, r.output
    m = repo.manifest("cfg", "mlp", r.stdout.strip())
    assert m.max_batch_size == 16 and m.instance_count == 3 and m.dynamic_batching.max_queue_delay_us == 100
    assert m.queue_policy.max_queue_size == 4 and m.queue_policy.timeout_action == "delay"

    # TorchScript: the config states the signature that --input/--output would
    cfg.write_text(TS_CONFIG)
    r = cli("upload", "--store", s3_uri, "--tenant", "cfg", "--model", "ts", demo_files / "net.pt", "--config", cfg)
    assert r.exit_code == 0, r.output
    m = repo.manifest("cfg", "ts", r.stdout.strip())
    assert m.format is ModelFormat.TORCHSCRIPT and m.max_batch_size == 8 and m.inputs[0].shape == [-1, 16]

    # the config's platform is checked against the file
    r = cli("upload", "--store", s3_uri, "--tenant", "cfg", "--model", "x", demo_files / "mlp.onnx", "--config", cfg)
    assert r.exit_code == 1 and "the file is onnx" in r.output

    # refused and unknown fields stop the upload before anything is written
    cfg.write_text('backend: "python"\n')
    r = cli("upload", "--store", s3_uri, "--tenant", "cfg", "--model", "y", demo_files / "mlp.onnx", "--config", cfg)
    assert r.exit_code == 1 and "backend 'python'" in r.output
    cfg.write_text("max_batch_size: 4\ndynamic_batching { default_queue_policy { max_queue_sise: 4 } }\n")
    r = cli("upload", "--store", s3_uri, "--tenant", "cfg", "--model", "y", demo_files / "mlp.onnx", "--config", cfg)
    assert r.exit_code == 1 and "dynamic_batching.default_queue_policy.max_queue_sise" in r.output
    assert repo.versions("cfg", "y") == [] and repo.versions("cfg", "x") == []


@pytest.mark.parametrize("ext", ["yaml", "json"])
def test_upload_refuses_a_nested_typo(cli, s3_uri, repo, demo_files, tmp_path, ext):
    cfg = tmp_path / f"c.{ext}"
    cfg.write_text('{"max_batch_size": 4, "queue_policy": {"max_queue_sise": 4}}')
    r = cli("upload", "--store", s3_uri, "--tenant", "cfg", "--model", "z", demo_files / "mlp.onnx", "--config", cfg)
    assert r.exit_code == 1 and "queue_policy.max_queue_sise" in r.output
    assert repo.versions("cfg", "z") == []


def test_import_indexes_the_new_versions_in_redis(cli, s3_uri, repo, redis_server, triton_repo_good):
    import uuid

    from catalog.index import RedisCatalog, connect_redis

    prefix = f"t-{uuid.uuid4().hex[:8]}:"
    rcat = RedisCatalog(connect_redis(redis_server.url), repo, prefix=prefix)
    rcat.rebuild()  # an empty, ready index: what it lists from now on comes from Redis, not from storage
    r = cli("import", "triton", "--store", s3_uri, "--tenant", "acme", triton_repo_good,
            "--redis", redis_server.url, "--redis-prefix", prefix)
    assert r.exit_code == 0, r.output
    assert rcat.ready() and rcat.versions("acme", "mlp") == ["1", "2"] and rcat.versions("acme", "ts") == ["1"]
    assert rcat.resolve("acme", "mlp").max_batch_size == 16
