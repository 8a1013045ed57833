"""`mmhost hostd`: run one host daemon."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command()
    def hostd(
        listen: str = typer.Option(None, help="gRPC address HOST:PORT [env MMHOST_HOSTD_LISTEN]"),
        store: str = typer.Option(None, help="model store: folder, file:// or s3://bucket/prefix [MMHOST_HOSTD_STORE]"),
        metrics_port: int = typer.Option(None, help="Prometheus port, 0 = off [MMHOST_HOSTD_METRICS_PORT]"),
        default_tenant: str = typer.Option(None, help="tenant for calls without mmhost-tenant metadata"),
        preload: bool = typer.Option(None, "--preload/--lazy", help="load every model at start, or on first request"),
        device: str = typer.Option(None, help="auto, cpu or cuda"),
        cache_dir: Path = typer.Option(None, help="local disk tier for model files"),
        ort_threads: int = typer.Option(None, help="ONNX Runtime intra-op threads (0 = default)"),
        log_level: str = typer.Option("INFO", help="logging level"),
    ) -> None:
        """Serve models from a store over the v2 / Triton gRPC protocol."""
        from hostd.server import serve
        from mmhost.cli import setup_logging
        from mmhost.settings import HostdSettings, S3Settings

        setup_logging(log_level)
        overrides = {
            "listen": listen, "store": store, "metrics_port": metrics_port, "default_tenant": default_tenant,
            "preload": preload, "device": device, "cache_dir": cache_dir, "ort_intra_op_threads": ort_threads,
        }
        settings = HostdSettings(**{k: v for k, v in overrides.items() if v is not None})
        serve(settings, S3Settings())
