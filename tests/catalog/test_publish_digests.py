"""publish_version takes the (size, sha256) a caller already computed (the router hashes an upload as it
arrives) and does not read those files again; one sha256_file (ground/hashing.py) serves every caller."""

from __future__ import annotations

import hashlib

import pytest

import catalog.publish as publish
from catalog.publish import publish_version
from catalog.repository import ModelRepository
from ground.hashing import sha256_file
from ground.manifest import ModelFormat, ModelManifest, TensorSpec
from storage_adapters.local import LocalStorage


def _manifest(version: str = "1") -> ModelManifest:
    t = [TensorSpec(name="x", datatype="FP32", shape=[-1, 2])]
    return ModelManifest(tenant="acme", model="m", version=version, format=ModelFormat.ONNX,
                         model_file="model.onnx", inputs=t, outputs=t)


@pytest.fixture
def repo(tmp_path) -> ModelRepository:
    return ModelRepository(LocalStorage(str(tmp_path / "store")))


def test_known_digests_are_not_computed_again(repo, tmp_path, monkeypatch):
    f = tmp_path / "model.onnx"
    f.write_bytes(b"model bytes")
    want = hashlib.sha256(b"model bytes").hexdigest()

    def no_hashing(path, progress=None):
        raise AssertionError(f"{path} hashed again")

    monkeypatch.setattr(publish, "sha256_file", no_hashing)
    final = publish_version(repo, _manifest(), {"model.onnx": f}, None, {"model.onnx": (11, want)})
    assert [(e.path, e.size, e.sha256) for e in final.files] == [("model.onnx", 11, want)]
    assert repo.manifest("acme", "m", "1").files == final.files


def test_files_without_a_known_digest_are_hashed(repo, tmp_path):
    f = tmp_path / "model.onnx"
    f.write_bytes(b"other bytes")
    final = publish_version(repo, _manifest(), {"model.onnx": f})
    assert final.files[0].sha256 == hashlib.sha256(b"other bytes").hexdigest()


def test_a_file_changed_since_it_was_hashed_is_not_published(repo, tmp_path):
    f = tmp_path / "model.onnx"
    f.write_bytes(b"grown since")
    with pytest.raises(ValueError, match="changed since"):
        publish_version(repo, _manifest(), {"model.onnx": f}, known={"model.onnx": (3, "0" * 64)})
    assert repo.versions("acme", "m") == []


def test_one_sha256_file_for_every_caller(tmp_path):
    from hostd.cache import stamps
    from mmhost.upload_client import digest

    f = tmp_path / "blob"
    data = b"\1" * ((1 << 20) + 7)  # over one chunk
    f.write_bytes(data)
    seen: list[int] = []
    assert sha256_file(f, seen.append) == hashlib.sha256(data).hexdigest()
    assert seen == [1 << 20, 7]
    assert publish.sha256_file is sha256_file and stamps.sha256_file is sha256_file  # re-exported
    assert digest(f) == (len(data), hashlib.sha256(data).hexdigest())
