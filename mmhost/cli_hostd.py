"""`mmhost hostd`: run one host daemon. Every flag is a HostdSettings (or HeartbeatSettings) field; unset
flags leave the field to its environment variable or default, both shown in `--help`."""

# setting_option() returns a typer.Option, as typer.Option(...) does (an immutable call in ruff's config)
# ruff: noqa: B008
from __future__ import annotations

from pathlib import Path

import typer

from ground.settings import HeartbeatSettings, HostdSettings
from mmhost.cli_errors import setting_option

H, HB = HostdSettings, HeartbeatSettings
# byte-size fields, checked before anything starts (a fraction is taken of this stand-in total)
SIZES = ("device_memory", "ram_cache_bytes", "disk_cache_bytes", "inflight_bytes", "tenant_inflight_bytes",
         "memory_limit")


def check_sizes(settings: HostdSettings) -> None:
    from ground.units import parse_bytes
    from mmhost.cli_errors import SettingError

    for field in SIZES:
        value = getattr(settings, field)
        if value in ("", None):
            continue
        try:
            parse_bytes(value, None if field in ("disk_cache_bytes", "memory_limit") else 1 << 40)
        except ValueError as e:
            raise SettingError("HostdSettings", field, value, str(e)) from None


def register(app: typer.Typer) -> None:
    @app.command()
    def hostd(
        listen: str = setting_option(H, "listen", help="gRPC address HOST:PORT"),
        store: str = setting_option(H, "store", help="model store: folder, file:// or s3://bucket/prefix "
                                    "(MMHOST_STORE is read too)"),
        metrics_port: int = setting_option(H, "metrics_port", help="Prometheus port (/metrics), 0 = off"),
        default_tenant: str = setting_option(H, "default_tenant"),
        plaintext: bool = setting_option(H, "plaintext", "--plaintext/--tls", help="serve without TLS (demo and tests); "
                                         "else tls_cert/tls_key (+ tls_client_ca) are needed"),
        dev_mode: bool = setting_option(H, "dev_mode", "--dev-mode/--no-dev-mode", help="calls without mmhost-tenant act as "
                                        "--default-tenant instead of being refused"),
        preload: bool = setting_option(H, "preload", "--preload/--lazy",
                                       help="load every model at start, or on first request"),
        device: str = setting_option(H, "device", help="auto, cpu or cuda"),
        cache_dir: Path = setting_option(H, "cache_dir"),
        ort_threads: int = setting_option(H, "ort_intra_op_threads", "--ort-threads"),
        device_memory: str = setting_option(H, "device_memory", help="device budget: bytes with a unit (8GiB) or a "
                                            "fraction of the device (0.8, 80%, 100%); a bare 1 is refused"),
        high_watermark: float = setting_option(H, "high_watermark"),
        low_watermark: float = setting_option(H, "low_watermark"),
        eviction_policy: str = setting_option(H, "eviction_policy"),
        ram_cache: str = setting_option(H, "ram_cache_bytes", "--ram-cache"),
        disk_cache: str = setting_option(H, "disk_cache_bytes", "--disk-cache"),
        tenant_shares: str = setting_option(H, "tenant_shares"),
        tenant_limits: str = setting_option(H, "tenant_limits"),
        host_group: str = setting_option(H, "host_group", help="placement group (routers' host_groups); '' = shared"),
        data_port: int = setting_option(H, "data_port", help="routers' calls on a TCP connection (TLS as gRPC's); 0 = any "
                                        "free port, -1 = off"),
        redis: str = setting_option(HB, "redis_url", "--redis", help="heartbeat to this Redis (routers discover "
                                    "the host)"),
        advertise: str = setting_option(HB, "advertise"),
        log_level: str = typer.Option("INFO", help="logging level"),
    ) -> None:
        """Serve models from a store over the v2 / Triton gRPC protocol."""
        from ground.settings import S3Settings
        from hostd.server import serve
        from mmhost.cli import setup_logging

        setup_logging(log_level)
        overrides = {
            "listen": listen, "store": store, "metrics_port": metrics_port, "default_tenant": default_tenant,
            "preload": preload, "device": device, "cache_dir": cache_dir, "ort_intra_op_threads": ort_threads,
            "device_memory": device_memory, "high_watermark": high_watermark, "low_watermark": low_watermark,
            "eviction_policy": eviction_policy, "ram_cache_bytes": ram_cache, "disk_cache_bytes": disk_cache,
            "tenant_shares": tenant_shares, "tenant_limits": tenant_limits, "plaintext": plaintext, "dev_mode": dev_mode,
            "host_group": host_group, "data_port": data_port,
        }
        settings = HostdSettings(**{k: v for k, v in overrides.items() if v is not None})
        check_sizes(settings)
        hb = HeartbeatSettings(**{k: v for k, v in {"redis_url": redis, "advertise": advertise}.items() if v is not None})
        serve(settings, S3Settings(), hb)
