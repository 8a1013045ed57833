"""The `mmhost` command. Each group of subcommands lives in its own module and registers here."""

from __future__ import annotations

import logging

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False, help="mmhost: multi-model, multi-tenant model hosting")


def setup_logging(level: str = "INFO") -> None:
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def _register() -> None:
    import importlib

    for mod in ("mmhost.cli_hostd", "mmhost.cli_demo", "mmhost.cli_store", "mmhost.cli_sim", "mmhost.cli_router",
                "mmhost.cli_top", "mmhost.cli_certs", "mmhost.cli_import"):
        importlib.import_module(mod).register(app)


_register()

if __name__ == "__main__":
    app()
