"""`mmhost upload` and `mmhost catalog list | rebuild | set-policy`: thin commands over mmhost.upload (operators,
--store), mmhost.upload_client (tenants, --router) and catalog.index. Settings (S3 from MMHOST_S3_*,
overridable by --s3-endpoint) are parsed here, once."""

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
    store: str | None = typer.Option(None, "--store", envvar="MMHOST_STORE", help="operators: write to this store "
                                     "directly (a folder, file:// or s3://bucket/prefix), with its credentials"),
    router: str | None = typer.Option(None, "--router", envvar="MMHOST_ROUTER", help="tenants: upload through this "
                                      "router (HOST:PORT) with --api-key; no store credentials needed"),
    api_key: str | None = typer.Option(None, "--api-key", envvar="MMHOST_API_KEY", help="with --router: your API key "
                                       "(it names your tenant)"),
    tls_ca: Path | None = typer.Option(None, "--tls-ca", help="with --router: CA of the router's certificate "
                                       "(default: the system's)"),
    plaintext: bool = typer.Option(False, "--plaintext", help="with --router: no TLS (demo and tests)"),
    tenant: str | None = typer.Option(None, "--tenant", help="with --store: the tenant (with --router it is the key's)"),
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
    max_bytes: int = typer.Option(2 << 30, "--max-bytes", min=1, envvar="MMHOST_UPLOAD_MAX_BYTES",
                                  help="size limit (--store; a router has its own, upload_max_bytes)"),
    uploaded_by: str = typer.Option("", "--uploaded-by", envvar="USER"),
    description: str = typer.Option("", "--description"),
    config: Path | None = typer.Option(None, "--config", help="YAML/JSON manifest options (batching, queue policy, instances)"),
    redis_url: str | None = typer.Option(None, "--redis", envvar="MMHOST_REDIS_URL", help="index the new version"),
    redis_prefix: str = REDIS_PREFIX,
    s3_endpoint: str | None = S3_ENDPOINT,
) -> None:
    """Validate a model, upload it as a new version (manifest last) and print the version. Operators write to
    the store (--store, --tenant); tenants go through a router with their API key (--router, --api-key)."""
    from mmhost.upload import UploadRefused, parse_tensor_spec, read_config

    err = Console(stderr=True)
    if (store is None) == (router is None):
        typer.echo("error: give --store (operators: the store itself) or --router (tenants: with --api-key)", err=True)
        raise typer.Exit(code=2)
    if router is not None and tenant is not None:
        typer.echo("error: --tenant is for --store; through a router the tenant is the one your API key names", err=True)
        raise typer.Exit(code=2)
    if router is not None and not api_key:
        typer.echo("error: --router needs --api-key (or MMHOST_API_KEY)", err=True)
        raise typer.Exit(code=2)
    if store is not None and tenant is None:
        typer.echo("error: --store needs --tenant", err=True)
        raise typer.Exit(code=2)
    try:
        ins = [parse_tensor_spec(s) for s in inputs]
        outs = [parse_tensor_spec(s) for s in outputs]
        cfg = read_config(config) if config else {}
    except (ValueError, UploadRefused) as e:
        raise _fail(err, str(e)) from None
    opts = dict(version=version, inputs=ins, outputs=outs, max_batch_size=max_batch_size,
                instance_count=instance_count, max_queue_delay_us=max_queue_delay_us, uploaded_by=uploaded_by,
                description=description)
    if router is not None:
        assert api_key is not None
        _upload_via_router(err, file, router, api_key, tls_ca, plaintext, model, fmt, cfg, opts)
        return
    assert store is not None and tenant is not None
    _upload_to_store(err, file, store, tenant, model, fmt, cfg, opts, max_bytes, redis_url, redis_prefix, s3_endpoint)


def _bar(err: Console) -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                    TimeRemainingColumn(), console=err, transient=True)


def _upload_via_router(err: Console, file: Path, router: str, api_key: str, tls_ca: Path | None, plaintext: bool,
                       model: str, fmt: ModelFormat | None, cfg: dict, opts: dict) -> None:
    from mmhost.upload_client import PublishFailed, RouterTarget, header, publish

    if not file.is_file():
        raise _fail(err, f"{file}: no such file")
    h = header(file, model, fmt=fmt.value if fmt else None, config=cfg, **opts)
    target = RouterTarget(router, api_key, tls_ca, plaintext)
    try:
        with _bar(err) as bar:
            task = bar.add_task(f"uploading {file.name}", total=h.size_bytes)

            def progress(n: int) -> None:
                bar.update(task, advance=n)
                if bar.tasks[task].completed >= h.size_bytes:
                    bar.update(task, description=f"validating {file.name} on the router")

            res = publish(target, h, file, progress)
    except PublishFailed as e:
        raise _fail(err, str(e)) from None
    err.print(f"uploaded {model} version {res.version} ({res.format}, {res.size_bytes} bytes, max_batch_size "
              f"{res.max_batch_size}) through {router}", highlight=False)
    if not res.indexed:
        err.print("[yellow]warning:[/yellow] stored, but the router could not index it: it becomes callable once "
                  "the operators rebuild the catalog index", highlight=False)
    typer.echo(res.version)


def _upload_to_store(err: Console, file: Path, store: str, tenant: str, model: str, fmt: ModelFormat | None, cfg: dict,
                     opts: dict, max_bytes: int, redis_url: str | None, redis_prefix: str,
                     s3_endpoint: str | None) -> None:
    from catalog.index import CatalogUnavailable
    from mmhost.upload import UploadRefused, UploadRequest, upload
    from storage_adapters.base import StorageError
    from storage_adapters.factory import StorageURIError

    req = UploadRequest(tenant=tenant, model=model, file=file, format=fmt, max_bytes=max_bytes, config=cfg, **opts)
    try:
        repo = _repo(store, s3_endpoint)
        with _bar(err) as bar:

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
