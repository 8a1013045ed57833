"""Session-wide real servers. Each test uses its own key prefix or bucket so tests do not interfere."""

from __future__ import annotations

import os

import pytest

from tests.servers import MotoServer, RedisServer

# Credentials for the local S3-compatible server; never real ones.
os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    srv = RedisServer(tmp_path_factory.mktemp("redis"))
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def s3_server():
    srv = MotoServer()
    yield srv
    srv.stop()
