"""Certificates for TLS tests, made the way operators make them (`mmhost certs`), and a look at the certificate
a server presents."""

from __future__ import annotations

import socket
import ssl
from pathlib import Path

from cryptography import x509
from typer.testing import CliRunner

from ground import tls
from mmhost.cli import app


def make_pki(out: Path, tenants: tuple[str, ...] = ("demo",)) -> Path:
    """`mmhost certs init` (router on 127.0.0.1/localhost, hostd by its TLS name) plus a client certificate
    per tenant, into `out`."""
    runner = CliRunner()
    res = runner.invoke(app, ["certs", "init", "--out", str(out), "--router-hosts", "127.0.0.1,localhost",
                              "--hostd-hosts", tls.HOSTD_TLS_NAME, "--days", "2"])
    assert res.exit_code == 0, res.output
    for tenant in tenants:
        res = runner.invoke(app, ["certs", "client", "--tenant", tenant, "--out", str(out), "--days", "2"])
        assert res.exit_code == 0, res.output
    return out


def served_serial(port: int) -> int:
    """The serial of the certificate the server presents to a new TLS connection (ALPN h2, as gRPC)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    ctx.set_alpn_protocols(["h2"])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s, ctx.wrap_socket(s) as t:
        der = t.getpeercert(binary_form=True)
    return x509.load_der_x509_certificate(der).serial_number
