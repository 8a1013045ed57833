"""Fixtures for the storage tests: every test gets its own bucket on the session's moto_server."""

from __future__ import annotations

import uuid

import boto3
import pytest

from ground.settings import S3Settings
from storage_adapters.s3 import S3Storage


def make_bucket(endpoint: str) -> str:
    name = f"t-{uuid.uuid4().hex[:20]}"
    boto3.session.Session().client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=name)
    return name


@pytest.fixture
def s3_settings(s3_server) -> S3Settings:
    # Small parts so that a test-sized object (tens of MB) moves in several parallel ranged parts.
    return S3Settings(
        endpoint_url=s3_server.endpoint,
        multipart_threshold=5 << 20,
        multipart_chunksize=5 << 20,
        max_concurrency=4,
    )


@pytest.fixture
def bucket(s3_server) -> str:
    return make_bucket(s3_server.endpoint)


@pytest.fixture
def s3_store(bucket, s3_settings) -> S3Storage:
    return S3Storage.from_uri(f"s3://{bucket}/root", s3_settings)


@pytest.fixture
def s3_uri(bucket) -> str:
    return f"s3://{bucket}/store"


@pytest.fixture
def cli(s3_server):
    """Run `mmhost ...` in-process through typer's CliRunner, with the S3 endpoint in the environment."""
    from typer.testing import CliRunner

    from mmhost.cli import app

    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(app, [str(a) for a in args], env={"MMHOST_S3_ENDPOINT_URL": s3_server.endpoint})

    return invoke


@pytest.fixture(scope="session")
def demo_files(tmp_path_factory):
    """Real small models of every format, and a pickle that must be refused."""
    from pathlib import Path

    from mmhost.demo_models import build_onnx_mlp, build_torch_export, build_torchscript

    d: Path = tmp_path_factory.mktemp("models")
    build_onnx_mlp(d / "mlp.onnx")
    build_onnx_mlp(d / "mlp2.onnx", seed=1)
    build_torchscript(d / "net.pt")
    build_torch_export(d / "net.pt2")
    return d
