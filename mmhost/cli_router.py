"""`mmhost router` (the tenants' front door) and `mmhost tenant create|set-limits|list|rotate-key|delete|
rebuild|export|import`.

Where tenants live: with --store (MMHOST_STORE) each tenant's record (key hash and limits) is written to the
model store first (tenants/<tenant>/tenant.json, the source of truth), then indexed in Redis (--redis);
`tenant rebuild` restores the index from the store after a Redis loss. Redis without a store works but is
not durable (the commands warn). --tenants FILE is the embedded mode's registry."""

# setting_option() returns a typer.Option, as typer.Option(...) does (an immutable call in ruff's config)
# ruff: noqa: B008
from __future__ import annotations

import json
import os
import sys
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

import typer

REDIS_HELP = "Redis mode: the tenant index in Redis (env MMHOST_REDIS_URL)"
FILE_HELP = "embedded mode: the tenants file (holds key hashes only)"
STORE_HELP = "model store holding the tenant records, the source of truth (folder, file:// or s3://)"
REDIS = typer.Option(None, "--redis", help=REDIS_HELP)
TENANTS = typer.Option(None, "--tenants", help=FILE_HELP)
STORE = typer.Option(None, "--store", envvar="MMHOST_STORE", help=STORE_HELP)
S3_ENDPOINT = typer.Option(None, "--s3-endpoint", help="S3-compatible endpoint URL (overrides MMHOST_S3_ENDPOINT_URL)")
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


def open_tenant_store(store: str, s3_endpoint: str | None = None):
    from catalog.tenants_store import TenantStore
    from ground.settings import S3Settings

    return TenantStore.open(store, S3Settings(endpoint_url=s3_endpoint) if s3_endpoint else S3Settings())


def open_registry(redis: str | None, tenants: Path | None, store: str | None = None, s3_endpoint: str | None = None,
                  writes: bool = False):
    """Redis (+ store), the store alone, or the tenants file. `writes`: say on stderr where a write does not
    reach (no store: not durable; no Redis: routers see it once the index is rebuilt)."""
    from router.tenants import FileTenants, RedisTenants, StoreTenants

    redis = redis or os.environ.get("MMHOST_REDIS_URL")
    if redis and tenants:
        raise typer.BadParameter("give --redis or --tenants, not both")
    if tenants:
        return FileTenants(tenants)  # the embedded mode: the file is the registry (a store in the env is not used)
    ts = open_tenant_store(store, s3_endpoint) if store else None
    if redis:
        from catalog.index import connect_redis

        if ts is None and writes:
            typer.echo("warning: no --store (MMHOST_STORE): this tenant is kept only in Redis and is lost with it; "
                       "see docs/runbooks/TenantRecovery.md", err=True)
        return RedisTenants(connect_redis(redis), os.environ.get("MMHOST_ROUTER_TENANTS_PREFIX", "mmhost:tenants:"), ts)
    if ts is not None:
        if writes:
            typer.echo("note: written to the store only; `mmhost tenant rebuild --store ... --redis ...` indexes it",
                       err=True)
        return StoreTenants(ts)
    raise typer.BadParameter("give --store URI and --redis URL (cluster), or --tenants FILE (embedded mode)")


@contextmanager
def _failing():
    """Registry, store and Redis errors: one line on stderr, exit code 1."""
    from redis import RedisError

    from router.tenants import TenantError
    from storage_adapters.base import StorageError

    try:
        yield
    except (TenantError, StorageError, RedisError, ValueError) as e:
        from mmhost.cli_errors import debug, explain

        if debug():  # MMHOST_DEBUG=1: the traceback
            raise
        typer.echo(f"error: {explain(e, 'tenant') or e}", err=True)
        raise typer.Exit(1) from None


def register(app: typer.Typer) -> None:
    from ground.settings import RouterSettings as R
    from mmhost.cli_errors import setting_option

    @app.command()
    def router(
        listen: str = setting_option(R, "listen"),
        rest_listen: str = setting_option(R, "rest_listen", help="also serve KServe v2 REST (HTTP/JSON) on this "
                                          "address, e.g. 127.0.0.1:8080; '' = off"),
        redis: str = setting_option(R, "redis_url", "--redis", help="Redis mode: hosts, tenants and catalog index"),
        hosts: str = setting_option(R, "hosts", help="embedded mode: hostd addresses ADDR,ADDR (polled)"),
        tenants: Path = setting_option(R, "tenants_file", "--tenants"),
        store: str = setting_option(R, "store", help="model store for the catalog (folder, file:// or s3://; "
                                    "MMHOST_STORE is read too)"),
        metrics_port: int = setting_option(R, "metrics_port", help="Prometheus port (/metrics), 0 = off"),
        access_log: str = setting_option(R, "access_log"),
        refresh_interval: float = setting_option(R, "refresh_interval_s", "--refresh-interval"),
        plaintext: bool = setting_option(R, "plaintext", "--plaintext/--tls", help="serve tenants without TLS (demo and "
                                         "tests); else tls_cert/tls_key are needed"),
        uploads: bool = setting_option(R, "uploads", "--uploads/--no-uploads", help="tenants publish models with "
                                       "their API key (`mmhost upload --router`), into --store"),
        fast_lane: str = setting_option(R, "fast_lane", "--fast-lane", help="haproxy: HAProxy serves --listen and "
                                        "sends unlimited tenants' calls to READY models straight to the host"),
        fast_lane_workers: int = setting_option(R, "fast_lane_workers", "--fast-lane-workers",
                                                help="with --fast-lane haproxy: more router processes for the Python "
                                                "lane; busy tenants get one of their own"),
        log_level: str = typer.Option("INFO", help="logging level"),
    ) -> None:
        """Serve the v2 / Triton gRPC protocol to tenants and route to host daemons."""
        from mmhost.cli import setup_logging
        from ground.settings import S3Settings
        from router.server import serve
        from ground.settings import RouterSettings

        setup_logging(log_level)
        overrides = {
            "listen": listen, "rest_listen": rest_listen, "redis_url": redis, "tenants_file": tenants, "store": store,
            "metrics_port": metrics_port, "access_log": access_log, "refresh_interval_s": refresh_interval,
            "plaintext": plaintext, "uploads": uploads, "fast_lane": fast_lane, "fast_lane_workers": fast_lane_workers,
            "hosts": [h.strip() for h in hosts.split(",") if h.strip()] if hosts else None,
        }
        serve(RouterSettings(**{k: v for k, v in overrides.items() if v is not None}), S3Settings())

    tenant_app = typer.Typer(no_args_is_help=True, help="Tenants and their API keys (keys are shown once, stored hashed)")
    app.add_typer(tenant_app, name="tenant")

    @tenant_app.command("create")
    def create(name: str, redis: str = REDIS, tenants: Path = TENANTS, store: str = STORE, s3_endpoint: str = S3_ENDPOINT,
               tier: str = typer.Option(None, help=TIER_HELP),
               rate: float = RATE, burst: int = BURST, max_concurrency: int = MAX_CONCURRENCY, weight: float = WEIGHT,
               instances: int = INSTANCES, default_priority: int = DEFAULT_PRIORITY,
               device_guaranteed: str = DEVICE_GUARANTEED, device_maximum: str = DEVICE_MAXIMUM,
               ) -> None:
        """Create a tenant and print its API key (shown once, never stored). Without --tier or limits the
        tenant is "unlimited" (no quotas)."""
        over = _limit_options(rate, burst, max_concurrency, weight, instances, default_priority, device_guaranteed,
                              device_maximum)
        with _failing():
            reg = open_registry(redis, tenants, store, s3_endpoint, writes=True)
            key = reg.create(name, tier, over)
            lim = reg.get(name).limits
        typer.echo(f"tenant {name} created ({describe_limits(lim)}). API key (shown once, store it now):")
        typer.echo(key)

    @tenant_app.command("set-limits")
    def set_limits(name: str, redis: str = REDIS, tenants: Path = TENANTS, store: str = STORE,
                   s3_endpoint: str = S3_ENDPOINT,
                   tier: str = typer.Option(None, help=TIER_HELP),
                   rate: float = RATE, burst: int = BURST, max_concurrency: int = MAX_CONCURRENCY, weight: float = WEIGHT,
                   instances: int = INSTANCES, default_priority: int = DEFAULT_PRIORITY,
                   device_guaranteed: str = DEVICE_GUARANTEED, device_maximum: str = DEVICE_MAXIMUM,
                   reset: bool = typer.Option(False, "--reset", help="drop earlier per-tenant overrides first"),
                   ) -> None:
        """Change a tenant's tier and limits; options not given keep their value. Routers and hostds pick
        the change up at their next refresh (about a second)."""
        over = _limit_options(rate, burst, max_concurrency, weight, instances, default_priority, device_guaranteed,
                              device_maximum)
        with _failing():
            rec = open_registry(redis, tenants, store, s3_endpoint, writes=True).set_limits(name, tier, over, reset)
        typer.echo(f"tenant {name}: {describe_limits(rec.limits)}")

    @tenant_app.command("rotate-key")
    def rotate_key(name: str, redis: str = REDIS, tenants: Path = TENANTS, store: str = STORE,
                   s3_endpoint: str = S3_ENDPOINT) -> None:
        """Replace a tenant's API key; the old key stops working at the routers' next refresh."""
        with _failing():
            key = open_registry(redis, tenants, store, s3_endpoint, writes=True).rotate_key(name)
        typer.echo(f"tenant {name}: new API key (shown once, store it now):")
        typer.echo(key)

    @tenant_app.command("list")
    def list_(redis: str = REDIS, tenants: Path = TENANTS, store: str = STORE, s3_endpoint: str = S3_ENDPOINT) -> None:
        """List tenants (from the store when given): name, tier and limits, dates and key-hash prefixes (keys
        themselves are never stored)."""

        def when(t: float) -> str:
            return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ") if t else "-"

        with _failing():
            recs = open_registry(redis, tenants, store, s3_endpoint).list()
        for r in recs:
            try:
                lim = describe_limits(r.limits)
            except ValueError as e:
                lim = f"invalid limits {r.spec}: {e}"
            typer.echo(f"{r.name}\t{lim}\tcreated {when(r.created)}\tkey rotated {when(r.rotated)}"
                       f"\tkey sha256 {r.key_sha256[:12]}…")

    @tenant_app.command("delete")
    def delete(name: str, redis: str = REDIS, tenants: Path = TENANTS, store: str = STORE,
               s3_endpoint: str = S3_ENDPOINT) -> None:
        """Delete a tenant: its key stops working (its models stay in the store)."""
        with _failing():
            open_registry(redis, tenants, store, s3_endpoint, writes=True).delete(name)
        typer.echo(f"tenant {name} deleted")

    @tenant_app.command("rebuild")
    def rebuild(store: str = typer.Option(..., "--store", envvar="MMHOST_STORE", help=STORE_HELP),
                redis: str = typer.Option(..., "--redis", envvar="MMHOST_REDIS_URL", help=REDIS_HELP),
                s3_endpoint: str = S3_ENDPOINT,
                prune: bool = typer.Option(False, "--prune", help="also remove tenants only Redis has (not in the store)"),
                ) -> None:
        """Restore the Redis tenant index from the store (after FLUSHALL, a restart without persistence or a
        failover to an empty replica): every tenant with its key hash and limits, in one transaction. Safe at
        any time; `mmhost catalog rebuild` does this too."""
        with _failing():
            report = open_registry(redis, None, store, s3_endpoint).rebuild(prune)
        typer.echo(str(report))

    @tenant_app.command("export")
    def export(file: str = typer.Argument(..., help="JSON file to write, '-' for stdout"),
               redis: str = REDIS, tenants: Path = TENANTS, store: str = STORE, s3_endpoint: str = S3_ENDPOINT) -> None:
        """Write every tenant's record (key hash and limits, never a key) as JSON {"tenants": {name: record}},
        the tenants-file format: from the store when given, else Redis, else the tenants file."""
        from router.tenants import export_json

        with _failing():
            data = export_json(open_registry(redis, tenants, store, s3_endpoint))
        body = json.dumps(data, indent=1, sort_keys=True) + "\n"
        if file == "-":
            sys.stdout.write(body)
        else:
            fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(body)
        typer.echo(f"exported {len(data['tenants'])} tenant(s)", err=True)

    @tenant_app.command("import")
    def import_(file: Path = typer.Argument(..., exists=True, dir_okay=False, help="a `tenant export` file"),
                redis: str = REDIS, tenants: Path = TENANTS, store: str = STORE, s3_endpoint: str = S3_ENDPOINT) -> None:
        """Add or replace the tenants of an export, as they are (same key hashes, so the same keys keep
        working, and the same limits): into the store and then the Redis index, or the tenants file."""
        from router.tenants import TenantError, parse_export

        with _failing():
            try:
                raw = json.loads(file.read_text())
            except ValueError as e:
                raise TenantError(f"{file} is not JSON: {e}") from None
            recs = parse_export(raw)
            open_registry(redis, tenants, store, s3_endpoint, writes=True).import_records(recs)
        typer.echo(f"imported {len(recs)} tenant(s): {', '.join(r.name for r in recs)}")
