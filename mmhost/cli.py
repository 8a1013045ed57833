"""The `mmhost` command. Each group of subcommands lives in its own module and registers here. Every
subcommand runs inside one error boundary (mmhost/cli_errors.py): expected failures print one line and exit 1,
usage errors exit 2, bugs keep their traceback (MMHOST_DEBUG=1: always)."""

from __future__ import annotations

import logging

import typer

from mmhost.cli_errors import BoundaryGroup

app = typer.Typer(no_args_is_help=True, add_completion=False, cls=BoundaryGroup, pretty_exceptions_show_locals=False,
                  help="mmhost: multi-model, multi-tenant model hosting")


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("mmhost")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"mmhost {version()}")
        raise typer.Exit()


@app.callback()
def main(
    _version: bool = typer.Option(False, "--version", callback=_show_version, is_eager=True,
                                  help="print the version and exit"),
) -> None:
    """mmhost: multi-model, multi-tenant model hosting (KServe v2 / Triton gRPC)."""


def setup_logging(level: str = "INFO") -> None:
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def _register() -> None:
    import importlib

    for mod in ("mmhost.cli_hostd", "mmhost.cli_demo", "mmhost.cli_store", "mmhost.cli_sim", "mmhost.cli_router",
                "mmhost.cli_top", "mmhost.cli_certs", "mmhost.cli_import", "mmhost.cli_sim_calibrate"):
        importlib.import_module(mod).register(app)


_register()

if __name__ == "__main__":
    app()
