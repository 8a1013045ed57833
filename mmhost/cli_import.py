"""`mmhost import triton`: bring a Triton model repository into a store (mmhost.triton_import does the work).

Exit codes: 0 every model imported; 1 any model or version refused (the table says why); 2 usage errors,
an unsupported --store among them."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn
from rich.table import Table

from mmhost.cli_store import REDIS_PREFIX, S3_ENDPOINT, STORE

import_app = typer.Typer(no_args_is_help=True, help="Bring models over from another server's model repository")


@import_app.command("triton")
def triton_cmd(
    repo_dir: Path = typer.Argument(..., exists=True, file_okay=False, help="Triton model repository folder"),
    store: str = STORE,
    tenant: str = typer.Option(..., "--tenant"),
    uploaded_by: str = typer.Option("", "--uploaded-by", envvar="USER"),
    max_bytes: int = typer.Option(2 << 30, "--max-bytes", min=1, envvar="MMHOST_UPLOAD_MAX_BYTES", help="size limit"),
    redis_url: str | None = typer.Option(None, "--redis", envvar="MMHOST_REDIS_URL", help="index the new versions"),
    redis_prefix: str = REDIS_PREFIX,
    s3_endpoint: str | None = S3_ENDPOINT,
) -> None:
    """Import every <model>/config.pbtxt with its version folders; print model -> versions or the refusal."""
    from catalog.index import CatalogUnavailable
    from mmhost.cli_store import _redis_catalog, _repo
    from mmhost.triton_import import import_model, model_dirs
    from storage_adapters.base import StorageError
    from storage_adapters.factory import StorageURIError

    out, err = Console(), Console(stderr=True)
    try:
        repo = _repo(store, s3_endpoint)
    except StorageURIError as e:
        typer.echo(f"error: --store: {e}", err=True)  # one line, whatever the terminal width
        raise typer.Exit(code=2) from None
    dirs = model_dirs(repo_dir)
    if not dirs:
        err.print(f"[red]error:[/red] {escape(str(repo_dir))} holds no model folders", highlight=False)
        raise typer.Exit(code=1)
    results = []
    try:
        with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                      console=err, transient=True) as bar:
            overall = bar.add_task("importing", total=len(dirs))

            def progress_for(path: str, size: int):
                task = bar.add_task(f"  uploading {path}", total=size)
                return lambda n: bar.update(task, advance=n)

            for d in dirs:
                bar.update(overall, description=f"importing {d.name}")
                r = import_model(repo, d, tenant, uploaded_by=uploaded_by, max_bytes=max_bytes, progress_for=progress_for,
                                 step=lambda m: bar.update(overall, description=m))
                results.append(r)
                bar.advance(overall)
        if redis_url:
            cat = _redis_catalog(repo, redis_url, redis_prefix)
            for r in results:
                for m in r.manifests:
                    cat.index_version(m)
    except (StorageError, CatalogUnavailable) as e:
        err.print(f"[red]error:[/red] {escape(str(e))}", highlight=False)
        raise typer.Exit(code=1) from None

    for r in results:
        for w in r.warnings:
            err.print(f"[yellow]warning:[/yellow] {r.model}: {escape(w)}", highlight=False)
    table = Table(title=escape(f"Triton repository {repo_dir} -> tenant {tenant} in {repo.description}"))
    for col in ("model", "imported", "result"):
        table.add_column(col, overflow="fold")
    for r in results:
        if r.refused:
            status = f"[red]refused[/red]: {escape(r.refused)}"
        elif r.version_errors:
            status = "[red]refused[/red]: " + "; ".join(f"version {v}: {escape(why)}" for v, why in r.version_errors.items())
        else:
            status = "imported"
            if r.already_stored:
                status += f" (already stored: {','.join(r.already_stored)})"
        if r.skipped:
            status += f"; not imported by version_policy: {','.join(r.skipped)}"
        table.add_row(r.model, ",".join(r.imported) or "-", status)
    out.print(table, soft_wrap=False)
    refused = [r.model for r in results if not r.ok]
    if refused:
        raise typer.Exit(code=1)


def register(app: typer.Typer) -> None:
    app.add_typer(import_app, name="import")
