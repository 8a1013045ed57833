"""`mmhost upload` and `mmhost catalog list | rebuild | set-policy`: thin commands over mmhost.upload and
catalog.index. Settings (S3 from MMHOST_S3_*, overridable by --s3-endpoint) are parsed here, once."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn
from rich.table import Table

from ground.manifest import ModelFormat, VersionPolicy

catalog_app = typer.Typer(no_args_is_help=True, help="What is stored: list, rebuild the Redis index, set policies")

STORE = typer.Option(..., "--store", envvar="MMHOST_STORE", help="model store: a folder, file:// or s3://bucket/prefix")
S3_ENDPOINT = typer.Option(None, "--s3-endpoint", help="S3-compatible endpoint URL (overrides MMHOST_S3_ENDPOINT_URL)")
REDIS_PREFIX = typer.Option("mmhost:catalog:", "--redis-prefix", help="Redis key prefix of the catalog index",
                            envvar=["MMHOST_ROUTER_CATALOG_PREFIX", "MMHOST_CATALOG_PREFIX"])  # 2nd: old name


def _fail(console: Console, msg: str) -> typer.Exit:
    console.print(f"[red]error:[/red] {msg}", highlight=False)
    return typer.Exit(code=1)


def _repo(store: str, s3_endpoint: str | None):
    from ground.settings import S3Settings
    from storage_adapters.factory import open_storage
    from catalog.repository import ModelRepository

    s3 = S3Settings(endpoint_url=s3_endpoint) if s3_endpoint else S3Settings()
    return ModelRepository(open_storage(store, s3))


def _check_local(repo) -> None:
    """A local store that is not there is a mistake (a typo, the wrong folder), not an empty store."""
    root = getattr(repo.storage, "root", None)
    if root is not None and not root.is_dir():
        from storage_adapters.base import StorageError

        raise StorageError(f"local store {root}: no such folder")


def _redis_catalog(repo, url: str, prefix: str):
    from catalog.index import RedisCatalog, connect_redis

    return RedisCatalog(connect_redis(url), repo, prefix=prefix)


def upload_cmd(
    file: Path = typer.Argument(..., exists=False, help="the model file (ONNX, TorchScript or torch.export .pt2)"),
    store: str = STORE,
    tenant: str = typer.Option(..., "--tenant"),
    model: str = typer.Option(..., "--model"),
    version: str | None = typer.Option(None, "--version", help="default: one past the highest existing version"),
    fmt: ModelFormat | None = typer.Option(None, "--format", help="checked against the file's content"),
    inputs: list[str] = typer.Option([], "--input", help="name:DTYPE:d1,d2 (-1 = dynamic); required for TorchScript"),
    outputs: list[str] = typer.Option([], "--output", help="name:DTYPE:d1,d2; required for TorchScript"),
    max_batch_size: int | None = typer.Option(
        None, "--max-batch-size", min=0, help="default 32 when the first dimension is dynamic; 0 turns batching off"
    ),
    instance_count: int = typer.Option(1, "--instance-count", min=1, max=64),
    max_queue_delay_us: int = typer.Option(0, "--max-queue-delay-us", min=0),
    max_bytes: int = typer.Option(2 << 30, "--max-bytes", min=1, envvar="MMHOST_UPLOAD_MAX_BYTES", help="size limit"),
    uploaded_by: str = typer.Option("", "--uploaded-by", envvar="USER"),
    description: str = typer.Option("", "--description"),
    config: Path | None = typer.Option(None, "--config", help="YAML/JSON manifest options (batching, queue policy, instances)"),
    redis_url: str | None = typer.Option(None, "--redis", envvar="MMHOST_REDIS_URL", help="index the new version"),
    redis_prefix: str = REDIS_PREFIX,
    s3_endpoint: str | None = S3_ENDPOINT,
) -> None:
    """Validate a model, upload it as a new version (manifest last) and print the version."""
    from catalog.index import CatalogUnavailable
    from mmhost.upload import UploadRefused, UploadRequest, parse_tensor_spec, read_config, upload
    from storage_adapters.base import StorageError
    from storage_adapters.factory import StorageURIError

    err = Console(stderr=True)
    try:
        req = UploadRequest(
            tenant=tenant,
            model=model,
            file=file,
            version=version,
            format=fmt,
            inputs=[parse_tensor_spec(s) for s in inputs],
            outputs=[parse_tensor_spec(s) for s in outputs],
            max_batch_size=max_batch_size,
            instance_count=instance_count,
            max_queue_delay_us=max_queue_delay_us,
            max_bytes=max_bytes,
            uploaded_by=uploaded_by,
            description=description,
            config=read_config(config) if config else {},
        )
    except (ValueError, UploadRefused) as e:
        raise _fail(err, str(e)) from None
    try:
        repo = _repo(store, s3_endpoint)
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=err,
            transient=True,
        ) as bar:

            def progress_for(path: str, size: int):
                task = bar.add_task(f"uploading {path}", total=size)
                return lambda n: bar.update(task, advance=n)

            manifest = upload(repo, req, progress_for)
        if redis_url:
            _redis_catalog(repo, redis_url, redis_prefix).index_version(manifest)
    except StorageURIError as e:  # a usage error: exit 2, as typer does for a bad option
        typer.echo(f"error: --store: {e}", err=True)
        raise typer.Exit(code=2) from None
    except (UploadRefused, StorageError, CatalogUnavailable) as e:
        raise _fail(err, str(e)) from None
    err.print(
        f"uploaded {tenant}/{model} version {manifest.version} ({manifest.format.value}, "
        f"{manifest.total_bytes} bytes, max_batch_size {manifest.max_batch_size}) to {repo.description}",
        highlight=False,
    )
    typer.echo(manifest.version)


@catalog_app.command("list")
def list_cmd(
    store: str = STORE,
    tenant: str | None = typer.Option(None, "--tenant"),
    redis_url: str | None = typer.Option(None, "--redis", envvar="MMHOST_REDIS_URL", help="read the Redis index"),
    redis_prefix: str = REDIS_PREFIX,
    s3_endpoint: str | None = S3_ENDPOINT,
) -> None:
    """Show the stored models: versions, policy, and the newest version's format, size and uploader."""
    from catalog.index import CatalogUnavailable, StorageCatalog
    from storage_adapters.base import StorageError

    out, err = Console(), Console(stderr=True)
    try:
        repo = _repo(store, s3_endpoint)
        _check_local(repo)
        cat = _redis_catalog(repo, redis_url, redis_prefix) if redis_url else StorageCatalog(repo)
        table = Table(title=f"models in {repo.description}" + (f" (index {cat.location})" if redis_url else ""))
        for col in ("tenant", "model", "versions", "policy", "latest format", "bytes", "uploaded"):
            table.add_column(col, justify="right" if col == "bytes" else "left")
        for t, m, vs, pol in cat.entries(tenant):
            newest = cat.manifest(t, m, vs[-1])
            when = newest.uploaded_at.strftime("%Y-%m-%d %H:%M") if newest.uploaded_at else ""
            table.add_row(
                t, m, ",".join(vs), _policy_text(pol), newest.format.value, str(newest.total_bytes),
                f"{when} {newest.uploaded_by}".strip(),
            )
    except (StorageError, CatalogUnavailable) as e:
        raise _fail(err, str(e)) from None
    out.print(table)


def _policy_text(p: VersionPolicy) -> str:
    if p.kind == "pinned":
        return f"pinned {p.version}"
    if p.kind == "split":
        return "split " + ",".join(f"{v}={w:g}" for v, w in p.weights.items())
    return "latest"


@catalog_app.command("rebuild")
def rebuild_cmd(
    store: str = STORE,
    redis_url: str = typer.Option(..., "--redis", envvar="MMHOST_REDIS_URL"),
    redis_prefix: str = REDIS_PREFIX,
    tenants_prefix: str = typer.Option("mmhost:tenants:", "--tenants-prefix", envvar="MMHOST_ROUTER_TENANTS_PREFIX",
                                       help="Redis key prefix of the tenant index"),
    s3_endpoint: str | None = S3_ENDPOINT,
) -> None:
    """Rebuild the Redis catalog index and the tenant index from storage (the source of truth); safe at any
    time. Tenants only Redis has are kept (see `mmhost tenant rebuild --prune`)."""
    from redis import RedisError

    from catalog.index import CatalogUnavailable
    from catalog.tenants_store import TenantStore
    from router.tenants import RedisTenants, TenantError
    from storage_adapters.base import StorageError

    err = Console(stderr=True)
    try:
        repo = _repo(store, s3_endpoint)
        _check_local(repo)  # rebuilding from a folder that is not there would empty the index
        cat = _redis_catalog(repo, redis_url, redis_prefix)
        with err.status("rebuilding the catalog index") as status:
            report = cat.rebuild(lambda m: status.update(f"indexed {m.tenant}/{m.model} version {m.version}"))
        typer.echo(str(report))
        tenants = RedisTenants(cat.r, tenants_prefix, TenantStore(repo.storage)).rebuild()
    except (StorageError, CatalogUnavailable) as e:
        raise _fail(err, str(e)) from None
    except (RedisError, TenantError) as e:
        raise _fail(err, f"tenant index at {cat.location}: {e}") from None
    typer.echo(f"tenants: {tenants}")


def parse_policy(kind: str, value: str | None) -> VersionPolicy:
    """latest | pinned V | split v1=0.9,v2=0.1"""
    if kind == "latest":
        return VersionPolicy()
    if kind == "pinned":
        if not value:
            raise ValueError("pinned needs a version: set-policy pinned 3")
        return VersionPolicy(kind="pinned", version=value)
    if kind == "split":
        if not value:
            raise ValueError("split needs weights: set-policy split 1=0.9,2=0.1")
        weights: dict[str, float] = {}
        for part in value.split(","):
            v, sep, w = part.partition("=")
            if not sep or not v:
                raise ValueError(f"split weight {part!r}: expected version=weight")
            weights[v.strip()] = float(w)
        return VersionPolicy(kind="split", weights=weights)
    raise ValueError(f"unknown policy {kind!r}: use latest, pinned V or split v1=w1,v2=w2")


@catalog_app.command("set-policy")
def set_policy_cmd(
    kind: str = typer.Argument(..., help="latest | pinned | split"),
    value: str | None = typer.Argument(None, help="the version (pinned) or v1=0.9,v2=0.1 (split)"),
    store: str = STORE,
    tenant: str = typer.Option(..., "--tenant"),
    model: str = typer.Option(..., "--model"),
    redis_url: str | None = typer.Option(None, "--redis", envvar="MMHOST_REDIS_URL", help="update the index too"),
    redis_prefix: str = REDIS_PREFIX,
    s3_endpoint: str | None = S3_ENDPOINT,
) -> None:
    """Set which version requests without an explicit version get. Written to storage, then indexed."""
    from catalog.index import CatalogUnavailable
    from storage_adapters.base import StorageError

    err = Console(stderr=True)
    try:
        policy = parse_policy(kind, value)
    except ValueError as e:
        raise _fail(err, str(e)) from None
    try:
        repo = _repo(store, s3_endpoint)
        versions = repo.versions(tenant, model)
        if not versions:
            raise _fail(err, f"{tenant}/{model} has no stored version")
        named = [policy.version] if policy.kind == "pinned" else list(policy.weights)
        missing = [v for v in named if v not in versions]
        if missing:
            raise _fail(err, f"{tenant}/{model} has no version {', '.join(missing)} (stored: {', '.join(versions)})")
        repo.set_policy(tenant, model, policy)
        if redis_url:
            _redis_catalog(repo, redis_url, redis_prefix).index_policy(tenant, model, policy)
    except (StorageError, CatalogUnavailable) as e:
        raise _fail(err, str(e)) from None
    typer.echo(f"{tenant}/{model}: {_policy_text(policy)}")


def register(app: typer.Typer) -> None:
    app.command("upload")(upload_cmd)
    app.add_typer(catalog_app, name="catalog")
