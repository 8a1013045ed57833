"""`mmhost certs`: a development CA and the certificates of a deployment (router TLS, router -> hostd mutual
TLS, tenant client certificates). For the demo, the tests and a first deployment; production uses cert-manager
(docs/deploy.md, "Trust boundaries")."""

from __future__ import annotations

from pathlib import Path

import typer


def _hosts(csv: str) -> list[str]:
    return [h.strip() for h in csv.split(",") if h.strip()]


def register(app: typer.Typer) -> None:
    from mmhost.certs import DEFAULT_DAYS, DEFAULT_HOSTD_HOSTS, DEFAULT_ROUTER_HOSTS

    certs = typer.Typer(no_args_is_help=True, help="development CA and certificates (TLS, mutual TLS)")
    app.add_typer(certs, name="certs")

    @certs.command("init")
    def init(
        out: Path = typer.Option(..., help="folder for the CA, keys and certificates"),
        router_hosts: str = typer.Option(",".join(DEFAULT_ROUTER_HOSTS),
                                         help="names and IPs tenants reach the router by (comma-separated)"),
        hostd_hosts: str = typer.Option(",".join(DEFAULT_HOSTD_HOSTS),
                                        help="names and IPs in hostd's serving certificate (routers verify "
                                             "mmhost-hostd whatever address they dial)"),
        days: int = typer.Option(DEFAULT_DAYS, help="validity in days"),
        force: bool = typer.Option(False, "--force", help="overwrite existing files (a new CA: reissue every cert)"),
    ) -> None:
        """A new CA plus router serving, router client and hostd serving certificates (keys mode 0600)."""
        from mmhost.certs import CertsError
        from mmhost.certs import init as do_init

        try:
            paths = do_init(out, _hosts(router_hosts), _hosts(hostd_hosts), days=days, force=force)
        except CertsError as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(1) from e
        for stem, (cert, key) in paths.items():
            typer.echo(f"{stem:14} {cert}  {key}")

    @certs.command("client")
    def client(
        tenant: str = typer.Option(..., help="tenant the certificate authenticates (SAN URI mmhost://tenant/T)"),
        out: Path = typer.Option(..., help="folder holding the CA made by `mmhost certs init`"),
        days: int = typer.Option(DEFAULT_DAYS, help="validity in days"),
        force: bool = typer.Option(False, "--force", help="overwrite an existing certificate for this tenant"),
    ) -> None:
        """A tenant's client certificate (an alternative to an API key), signed by the CA in --out."""
        from mmhost.certs import CertsError, tenant_client

        try:
            cert, key = tenant_client(out, tenant, days=days, force=force)
        except CertsError as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(1) from e
        typer.echo(f"tenant-{tenant}  {cert}  {key}")
