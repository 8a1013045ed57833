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
        device_memory: str = typer.Option(None, help="device budget: bytes (8GiB) or fraction of the device (0.8)"),
        high_watermark: float = typer.Option(None, help="evict when measured use passes this fraction of the budget"),
        low_watermark: float = typer.Option(None, help="...down to this fraction"),
        eviction_policy: str = typer.Option(None, help="lru (default) or gdsf (cost-aware)"),
        ram_cache: str = typer.Option(None, help="host RAM tier for model bytes (e.g. 2GiB; 0 = off)"),
        disk_cache: str = typer.Option(None, help="local disk tier bound (e.g. 20GiB)"),
        tenant_shares: str = typer.Option(None, help='JSON {"tenant": {"guaranteed": "25%", "maximum": "60%"}}'),
        tenant_limits: str = typer.Option(None, help="embedded mode: tenant limits file, e.g. the routers' tenants "
                                          "file (re-read when it changes) [MMHOST_HOSTD_TENANT_LIMITS]"),
        redis: str = typer.Option(None, "--redis", help="heartbeat to this Redis (routers discover the host) [MMHOST_REDIS_URL]"),
        advertise: str = typer.Option(None, help="address routers call, when it differs from --listen"),
        log_level: str = typer.Option("INFO", help="logging level"),
    ) -> None:
        """Serve models from a store over the v2 / Triton gRPC protocol."""
        from ground.settings import HeartbeatSettings
        from hostd.server import serve
        from mmhost.cli import setup_logging
        from ground.settings import HostdSettings, S3Settings

        setup_logging(log_level)
        overrides = {
            "listen": listen, "store": store, "metrics_port": metrics_port, "default_tenant": default_tenant,
            "preload": preload, "device": device, "cache_dir": cache_dir, "ort_intra_op_threads": ort_threads,
            "device_memory": device_memory, "high_watermark": high_watermark, "low_watermark": low_watermark,
            "eviction_policy": eviction_policy, "ram_cache_bytes": ram_cache, "disk_cache_bytes": disk_cache,
            "tenant_shares": tenant_shares, "tenant_limits": tenant_limits,
        }
        settings = HostdSettings(**{k: v for k, v in overrides.items() if v is not None})
        hb = HeartbeatSettings(**{k: v for k, v in {"redis_url": redis, "advertise": advertise}.items() if v is not None})
        serve(settings, S3Settings(), hb)
