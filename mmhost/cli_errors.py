"""The `mmhost` command's error boundary and its settings vocabulary.

Expected failures (Redis or storage unreachable, a port in use, an invalid setting, a missing file) print one
line on stderr naming what failed and which flag or environment variable to change, and exit 1; usage errors
exit 2 (click's own). Anything else is a bug and keeps its traceback; `MMHOST_DEBUG=1` shows tracebacks
always.

Environment variables: `MMHOST_<PART>_<FIELD>` for a process's settings (MMHOST_HOSTD_STORE,
MMHOST_ROUTER_METRICS_PORT, MMHOST_HOSTD_HEARTBEAT_INTERVAL_S), plus the names every part shares:
MMHOST_REDIS_URL, MMHOST_STORE (the store, for the admin commands and any part that sets none of its own)
and MMHOST_S3_*. Older names are still read, with one warning line at start (OLD_ENV)."""

from __future__ import annotations

import errno
import os
import sys

import click
import typer
from typer.core import TyperGroup

# old name -> current name; the old one is still read (copied to the new name when that is unset)
OLD_ENV = {
    "MMHOST_ROUTER_REDIS_URL": "MMHOST_REDIS_URL",
    "MMHOST_HOSTD_HEARTBEAT_REDIS_URL": "MMHOST_REDIS_URL",
    "MMHOST_CATALOG_PREFIX": "MMHOST_ROUTER_CATALOG_PREFIX",
}

# settings field -> its flag, where the flag is not the field's name with dashes
FLAGS = {
    "ort_intra_op_threads": "--ort-threads", "ram_cache_bytes": "--ram-cache", "disk_cache_bytes": "--disk-cache",
    "redis_url": "--redis", "tenants_file": "--tenants", "refresh_interval_s": "--refresh-interval",
}
# settings class -> the command part of its flags' and variables' names
_PARTS = {"HostdSettings": "hostd", "RouterSettings": "router", "HeartbeatSettings": "hostd", "S3Settings": ""}


class SettingError(Exception):
    """A setting whose value cannot be used: names the field, its flag and its environment variable."""

    def __init__(self, cls_name: str, field: str, value: object, why: str) -> None:
        self.cls_name, self.field, self.value, self.why = cls_name, field, value, why
        super().__init__(f"{field}={value!r}: {why}")


def env_name(cls_name: str, field: str) -> str:
    from ground import settings

    cls = getattr(settings, cls_name, None)
    if cls is None:
        return f"MMHOST_{field.upper()}"
    f = cls.model_fields.get(field)
    alias = getattr(f, "validation_alias", None) if f is not None else None
    choices = [c for c in getattr(alias, "choices", []) if isinstance(c, str) and c.startswith("MMHOST_")]
    return choices[0] if choices else cls.model_config.get("env_prefix", "MMHOST_") + field.upper()


def where(cls_name: str, field: str) -> str:
    flag = FLAGS.get(field, "--" + field.replace("_", "-"))
    if cls_name == "S3Settings":
        return f"env {env_name(cls_name, field)}"
    return f"flag {flag} or env {env_name(cls_name, field)}"


def _validation(e) -> str:
    parts = []
    for err in e.errors():
        field = str(err["loc"][0]) if err.get("loc") else "?"
        parts.append(f"invalid setting {field}={err.get('input')!r}: {err['msg']} ({where(e.title, field)})")
    return "; ".join(parts)


def explain(e: BaseException, command: str | None) -> str | None:
    """One line for an expected failure; None for a bug (which keeps its traceback)."""
    from pydantic import ValidationError

    part = {"hostd": "HOSTD", "router": "ROUTER"}.get(command or "", "")
    listen = (f"flag --listen / --metrics-port or env MMHOST_{part}_LISTEN / MMHOST_{part}_METRICS_PORT" if part
              else "the port flags")
    if isinstance(e, SettingError):
        return f"invalid setting {e.field}={e.value!r}: {e.why} ({where(e.cls_name, e.field)})"
    if isinstance(e, ValidationError):
        return _validation(e)
    try:
        import redis
    except ImportError:  # pragma: no cover - redis is a dependency
        redis = None
    if redis is not None and isinstance(e, (redis.ConnectionError, redis.TimeoutError)):
        return f"cannot reach Redis: {e} (flag --redis or env MMHOST_REDIS_URL)"
    from storage_adapters.base import StorageError

    if isinstance(e, StorageError):
        return f"storage: {e} (flag --store or env MMHOST_STORE; S3: MMHOST_S3_ENDPOINT_URL and the AWS credentials)"
    from catalog.index import CatalogUnavailable

    if isinstance(e, CatalogUnavailable):
        return f"catalog index: {e} (flag --redis or env MMHOST_REDIS_URL)"
    if isinstance(e, OSError) and e.errno == errno.EADDRINUSE:
        return f"port in use: {e} (another process listens there: stop it or change {listen})"
    if isinstance(e, RuntimeError) and str(e).startswith("Failed to bind to address"):  # grpc's add_insecure_port
        return f"cannot listen: {str(e).split(';')[0]} (port in use? change {listen})"
    if isinstance(e, FileNotFoundError):
        return f"no such file or folder: {e.filename or e}"
    if isinstance(e, PermissionError):
        return f"permission denied: {e.filename or e}"
    return None


def warn_old_env(environ=os.environ) -> None:
    for old, new in OLD_ENV.items():
        if old in environ:
            print(f"warning: {old} is an old name: use {new} (still read)", file=sys.stderr)
            environ.setdefault(new, environ[old])


def debug() -> bool:
    return os.environ.get("MMHOST_DEBUG", "") not in ("", "0", "false", "no")


class BoundaryGroup(TyperGroup):
    """The root command group: every subcommand runs inside the error boundary."""

    def invoke(self, ctx: click.Context):
        warn_old_env()
        try:
            return super().invoke(ctx)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort, SystemExit,
                KeyboardInterrupt):
            raise
        except Exception as e:  # noqa: BLE001 - the boundary: expected failures become one line
            msg = None if debug() else explain(e, ctx.invoked_subcommand)
            if msg is None:
                raise
            typer.echo(f"error: {msg}", err=True)
            raise typer.Exit(1) from None


def setting_option(cls, field: str, *decls: str, help: str | None = None, **kw):  # noqa: A002 - typer's name
    """A flag for a settings field: default None (the settings decide), and the help shows the settings'
    default and environment variable, so `--help` tells what an unset flag means."""
    f = cls.model_fields[field]
    default = f.get_default(call_default_factory=True)
    shown = "unset" if default in (None, "", []) else str(default)
    # parentheses, not brackets: typer's rich help would read [..] as markup and drop it
    text = f"{help or f.description or ''} (env {env_name(cls.__name__, field)}; default: {shown})"
    return typer.Option(None, *decls, help=text.strip(), show_default=False, **kw)
