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


@pytest.fixture(autouse=True, scope="session")
def _no_process_exit_in_the_test_process():
    """ground.serving.exit_now ends a stopped server's process with os._exit. Reached inside the test process
    (a CLI test that runs a role's command in-process) it would end pytest mid-run with status 0, the tests
    after it unrun and CI green; here the test that reached it fails instead."""
    import ground.serving

    def refuse(code: int = 0):
        raise AssertionError(f"ground.serving.exit_now({code}) was reached in the test process")

    real, ground.serving._exit = ground.serving._exit, refuse
    yield
    ground.serving._exit = real
