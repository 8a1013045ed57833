"""`mmhost router` (the tenants' front door) and `mmhost tenant create|set-limits|list|rotate-key|delete`."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import typer

REDIS_HELP = "Redis mode: the tenant registry in Redis [MMHOST_REDIS_URL]"
FILE_HELP = "embedded mode: the tenants file (holds key hashes only)"
TIER_HELP = "tier: free, standard, premium or unlimited (its defaults apply to every limit not set)"
# The per-tenant limit options, shared by `tenant create` and `tenant set-limits`.
RATE = typer.Option(None, help="requests/s admitted by each router (0 = unlimited)")
BURST = typer.Option(None, help="token bucket size (0 = max(1, rate))")
MAX_CONCURRENCY = typer.Option(None, help="requests in flight per router (0 = unlimited)")
WEIGHT = typer.Option(None, help="share of device execution time relative to other tenants")
INSTANCES = typer.Option(None, help="executors per model on each host (0 = the model's own)")
DEFAULT_PRIORITY = typer.Option(None, help="priority level for requests that name none (0 = model default)")
DEVICE_GUARANTEED = typer.Option(None, help="device memory no other tenant's load can take (bytes or fraction)")
DEVICE_MAXIMUM = typer.Option(None, help="device memory this tenant may hold at most")


def _limit_options(rate, burst, max_concurrency, weight, instances, default_priority, device_guaranteed,
                   device_maximum) -> dict:
    return {"rate": rate, "burst": burst, "max_concurrency": max_concurrency, "weight": weight,
            "instances": instances, "default_priority": default_priority, "device_guaranteed": device_guaranteed,
            "device_maximum": device_maximum}


def describe_limits(lim) -> str:
    def n(v, unit=""):
        return "unlimited" if not v else f"{v:g}{unit}"

    burst = lim.burst or (max(1, int(lim.rate)) if lim.rate else 0)
    return (f"tier {lim.tier}  rate {n(lim.rate, '/s')} burst {n(burst)}  concurrency {n(lim.max_concurrency)}  "
            f"weight {lim.weight:g}  instances {lim.instances or 'model'}  priority {lim.default_priority or 'model'}  "
            f"device guaranteed {lim.device_guaranteed} maximum {lim.device_maximum or '-'}")


def open_registry(redis: str | None, tenants: Path | None):
    import os

    from router.tenants import FileTenants, RedisTenants

    redis = redis or os.environ.get("MMHOST_REDIS_URL")
    if redis and tenants:
        raise typer.BadParameter("give --redis or --tenants, not both")
    if redis:
        from catalog.index import connect_redis

        return RedisTenants(connect_redis(redis), os.environ.get("MMHOST_ROUTER_TENANTS_PREFIX", "mmhost:tenants:"))
    if tenants:
        return FileTenants(tenants)
    raise typer.BadParameter("give --tenants FILE (embedded mode) or --redis URL")


def register(app: typer.Typer) -> None:
    @app.command()
    def router(
        listen: str = typer.Option(None, help="gRPC address tenants call [MMHOST_ROUTER_LISTEN]"),
        redis: str = typer.Option(None, "--redis", help="Redis mode: hosts, tenants and catalog index [MMHOST_REDIS_URL]"),
        hosts: str = typer.Option(None, help="embedded mode: hostd addresses ADDR,ADDR (polled)"),
        tenants: Path = typer.Option(None, help=FILE_HELP),
        store: str = typer.Option(None, help="model store for the catalog (folder, file:// or s3://)"),
        metrics_port: int = typer.Option(None, help="Prometheus port, 0 = off [MMHOST_ROUTER_METRICS_PORT]"),
        access_log: str = typer.Option(None, help="access log file (JSON lines), '-' for stdout"),
        refresh_interval: float = typer.Option(None, help="seconds between refreshes of the host view and tenants"),
        log_level: str = typer.Option("INFO", help="logging level"),
    ) -> None:
        """Serve the v2 / Triton gRPC protocol to tenants and route to host daemons."""
        from mmhost.cli import setup_logging
        from ground.settings import S3Settings
        from router.server import serve
        from ground.settings import RouterSettings

        setup_logging(log_level)
        overrides = {
            "listen": listen, "redis_url": redis, "tenants_file": tenants, "store": store,
            "metrics_port": metrics_port, "access_log": access_log, "refresh_interval_s": refresh_interval,
            "hosts": [h.strip() for h in hosts.split(",") if h.strip()] if hosts else None,
        }
        serve(RouterSettings(**{k: v for k, v in overrides.items() if v is not None}), S3Settings())

    tenant_app = typer.Typer(no_args_is_help=True, help="Tenants and their API keys (keys are shown once, stored hashed)")
    app.add_typer(tenant_app, name="tenant")

    def _fail(e: Exception) -> None:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1)

    @tenant_app.command("create")
    def create(name: str, redis: str = typer.Option(None, "--redis", help=REDIS_HELP),
               tenants: Path = typer.Option(None, help=FILE_HELP),
               tier: str = typer.Option(None, help=TIER_HELP),
               rate: float = RATE, burst: int = BURST, max_concurrency: int = MAX_CONCURRENCY, weight: float = WEIGHT,
               instances: int = INSTANCES, default_priority: int = DEFAULT_PRIORITY,
               device_guaranteed: str = DEVICE_GUARANTEED, device_maximum: str = DEVICE_MAXIMUM,
               ) -> None:
        """Create a tenant and print its API key (shown once, never stored). Without --tier or limits the
        tenant is "unlimited" (no quotas)."""
        from router.tenants import TenantError

        over = _limit_options(rate, burst, max_concurrency, weight, instances, default_priority, device_guaranteed,
                              device_maximum)
        try:
            reg = open_registry(redis, tenants)
            key = reg.create(name, tier, over)
            lim = reg.get(name).limits
        except TenantError as e:
            _fail(e)
        typer.echo(f"tenant {name} created ({describe_limits(lim)}). API key (shown once, store it now):")
        typer.echo(key)

    @tenant_app.command("set-limits")
    def set_limits(name: str, redis: str = typer.Option(None, "--redis", help=REDIS_HELP),
                   tenants: Path = typer.Option(None, help=FILE_HELP),
                   tier: str = typer.Option(None, help=TIER_HELP),
                   rate: float = RATE, burst: int = BURST, max_concurrency: int = MAX_CONCURRENCY, weight: float = WEIGHT,
                   instances: int = INSTANCES, default_priority: int = DEFAULT_PRIORITY,
                   device_guaranteed: str = DEVICE_GUARANTEED, device_maximum: str = DEVICE_MAXIMUM,
                   reset: bool = typer.Option(False, "--reset", help="drop earlier per-tenant overrides first"),
                   ) -> None:
        """Change a tenant's tier and limits; options not given keep their value. Routers and hostds pick
        the change up at their next refresh (about a second)."""
        from router.tenants import TenantError

        over = _limit_options(rate, burst, max_concurrency, weight, instances, default_priority, device_guaranteed,
                              device_maximum)
        try:
            rec = open_registry(redis, tenants).set_limits(name, tier, over, reset)
        except TenantError as e:
            _fail(e)
        typer.echo(f"tenant {name}: {describe_limits(rec.limits)}")

    @tenant_app.command("rotate-key")
    def rotate_key(name: str, redis: str = typer.Option(None, "--redis", help=REDIS_HELP),
                   tenants: Path = typer.Option(None, help=FILE_HELP)) -> None:
        """Replace a tenant's API key; the old key stops working at the routers' next refresh."""
        from router.tenants import TenantError

        try:
            key = open_registry(redis, tenants).rotate_key(name)
        except TenantError as e:
            _fail(e)
        typer.echo(f"tenant {name}: new API key (shown once, store it now):")
        typer.echo(key)

    @tenant_app.command("list")
    def list_(redis: str = typer.Option(None, "--redis", help=REDIS_HELP),
              tenants: Path = typer.Option(None, help=FILE_HELP)) -> None:
        """List tenants: name, tier and limits, dates and key-hash prefixes (keys themselves are never stored)."""
        from router.tenants import TenantError

        def when(t: float) -> str:
            return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ") if t else "-"

        try:
            recs = open_registry(redis, tenants).list()
        except TenantError as e:
            _fail(e)
        for r in recs:
            try:
                lim = describe_limits(r.limits)
            except ValueError as e:
                lim = f"invalid limits {r.spec}: {e}"
            typer.echo(f"{r.name}\t{lim}\tcreated {when(r.created)}\tkey rotated {when(r.rotated)}"
                       f"\tkey sha256 {r.key_sha256[:12]}…")

    @tenant_app.command("delete")
    def delete(name: str, redis: str = typer.Option(None, "--redis", help=REDIS_HELP),
               tenants: Path = typer.Option(None, help=FILE_HELP)) -> None:
        """Delete a tenant: its key stops working (its models stay in the store)."""
        from router.tenants import TenantError

        try:
            open_registry(redis, tenants).delete(name)
        except TenantError as e:
            _fail(e)
        typer.echo(f"tenant {name} deleted")
