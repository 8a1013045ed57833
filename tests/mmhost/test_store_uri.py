"""--store values: a folder, file:///abs/path or s3://bucket[/prefix]. Anything else (another cloud's scheme, a
malformed s3 URI) is refused before a byte is written, never taken for a local folder named 'gs:'."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from ground.settings import S3Settings
from mmhost.cli import app
from storage_adapters.factory import StorageURIError, check_store_uri, open_storage
from storage_adapters.local import LocalStorage
from storage_adapters.s3 import S3Storage
from tests.storage.conftest import make_bucket


@pytest.mark.parametrize(("uri", "kind", "where"), [
    ("./models", "local", "./models"),
    ("/srv/models", "local", "/srv/models"),
    ("models", "local", "models"),
    ("file:///srv/models", "local", "/srv/models"),
    ("s3://bucket", "s3", "s3://bucket"),
    ("s3://bucket/some/prefix", "s3", "s3://bucket/some/prefix"),
])
def test_supported_forms(uri, kind, where):
    assert check_store_uri(uri) == (kind, where)


@pytest.mark.parametrize(("uri", "why"), [
    ("gs://bucket/x", "Google Cloud Storage"),
    ("gcs://bucket/x", "Google Cloud Storage"),
    ("azure://container/x", "Azure"),
    ("abfss://c@acct.dfs.core.windows.net/x", "Azure"),
    ("http://minio:9000/bucket", "unknown scheme 'http:'"),
    ("https://bucket.s3.amazonaws.com/x", "unknown scheme 'https:'"),
    ("s3:/bucket", "malformed s3 URI"),
    ("s3:bucket", "malformed s3 URI"),
    ("s3://", "needs a bucket name"),
    ("s3:///prefix", "needs a bucket name"),
    ("S3://bucket", "lowercase"),
    ("file://relative/path", "absolute path"),
    ("models:v2", "unknown scheme"),
    ("", "empty"),
])
def test_unsupported_uris_are_refused_with_the_supported_forms(uri, why, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(StorageURIError) as ei:
        open_storage(uri, S3Settings())
    msg = str(ei.value)
    assert why in msg and "s3://bucket[/prefix]" in msg and "file:///abs/path" in msg, msg
    assert isinstance(ei.value, ValueError)
    assert list(tmp_path.iterdir()) == []  # no folder named 'gs:' or 's3:'


def test_open_storage_builds_the_backend(tmp_path):
    assert isinstance(open_storage(f"file://{tmp_path}"), LocalStorage)
    s3 = open_storage("s3://bucket/p", S3Settings(endpoint_url="http://127.0.0.1:1"))
    assert isinstance(s3, S3Storage) and s3.bucket == "bucket" and s3.prefix == "p/"


@pytest.mark.parametrize("store", ["gs://bucket/x", "s3:/bucket"])
def test_commands_exit_2_with_one_line(store, demo_files, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    (tmp_path / "repo" / "m").mkdir(parents=True)
    for args in (["upload", "--store", store, "--tenant", "a", "--model", "m", str(demo_files / "mlp.onnx")],
                 ["import", "triton", "--store", store, "--tenant", "a", str(tmp_path / "repo")]):
        r = runner.invoke(app, args)
        assert r.exit_code == 2, r.output
        lines = r.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: --store:") and store in lines[0], r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["repo"]


def test_an_s3_compatible_endpoint_from_the_command_line(s3_server, demo_files, monkeypatch):
    """How another cloud's bucket is used (docs/storage.md, 'Other clouds'): s3:// plus --s3-endpoint pointing
    at the provider's S3-compatible endpoint. Here the endpoint is moto_server, given only on the command line."""
    monkeypatch.delenv("MMHOST_S3_ENDPOINT_URL", raising=False)
    store = f"s3://{make_bucket(s3_server.endpoint)}/models"
    r = CliRunner().invoke(app, ["upload", "--store", store, "--tenant", "a", "--model", "m", str(demo_files / "mlp.onnx"),
                                 "--s3-endpoint", s3_server.endpoint])
    assert r.exit_code == 0, r.output
    assert s3_server.endpoint in r.output
