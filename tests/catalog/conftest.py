"""Fixtures for the catalog tests: the storage tests' bucket per test on the session's moto_server, the
`mmhost` command line in-process, and the demo model files."""

from __future__ import annotations

from tests.storage.conftest import bucket, cli, demo_files, s3_uri

__all__ = ["bucket", "cli", "demo_files", "s3_uri"]
