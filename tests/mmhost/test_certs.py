"""`mmhost certs`: the files it writes (modes, chains, usages, identities), idempotence, and its errors."""

from __future__ import annotations

import stat

from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from typer.testing import CliRunner

from ground import tls
from mmhost.cli import app

STEMS = ("ca", "router", "router-client", "hostd")


def load(path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def sans(cert) -> tuple[list[str], list[str], list[str]]:
    ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return ([str(v) for v in ext.get_values_for_type(x509.DNSName)],
            [str(v) for v in ext.get_values_for_type(x509.IPAddress)],
            ext.get_values_for_type(x509.UniformResourceIdentifier))


def usages(cert) -> set:
    return set(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)


def invoke(*args):
    return CliRunner().invoke(app, ["certs", *map(str, args)])


def test_init_writes_a_ca_and_the_three_certificates(tmp_path):
    r = invoke("init", "--out", tmp_path, "--router-hosts", "127.0.0.1,router.example", "--days", "30")
    assert r.exit_code == 0, r.output
    for s in STEMS:
        assert stat.S_IMODE((tmp_path / f"{s}-key.pem").stat().st_mode) == 0o600
        assert stat.S_IMODE((tmp_path / f"{s}.pem").stat().st_mode) == 0o644
        assert tls.key_matches_cert((tmp_path / f"{s}.pem").read_bytes(), (tmp_path / f"{s}-key.pem").read_bytes())
    ca = load(tmp_path / "ca.pem")
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    for s in STEMS[1:]:
        c = load(tmp_path / f"{s}.pem")
        c.verify_directly_issued_by(ca)
        assert not c.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
        assert (c.not_valid_after_utc - c.not_valid_before_utc).days <= 31

    router = load(tmp_path / "router.pem")
    assert sans(router)[:2] == (["router.example"], ["127.0.0.1"])
    assert usages(router) == {ExtendedKeyUsageOID.SERVER_AUTH}
    client = load(tmp_path / "router-client.pem")
    assert sans(client)[2] == [tls.ROUTER_IDENTITY]
    assert client.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "mmhost-router"
    assert usages(client) == {ExtendedKeyUsageOID.CLIENT_AUTH}
    hostd = load(tmp_path / "hostd.pem")
    assert tls.HOSTD_TLS_NAME in sans(hostd)[0] and usages(hostd) == {ExtendedKeyUsageOID.SERVER_AUTH}


def test_init_refuses_to_overwrite_unless_forced(tmp_path):
    assert invoke("init", "--out", tmp_path).exit_code == 0
    before = (tmp_path / "ca.pem").read_bytes()
    r = invoke("init", "--out", tmp_path)
    assert r.exit_code == 1 and "refusing to overwrite" in r.output
    assert (tmp_path / "ca.pem").read_bytes() == before
    assert invoke("init", "--out", tmp_path, "--force").exit_code == 0
    assert (tmp_path / "ca.pem").read_bytes() != before
    assert not list(tmp_path.glob(".*.tmp"))


def test_tenant_client_certificate(tmp_path):
    assert invoke("client", "--tenant", "acme", "--out", tmp_path).exit_code == 1  # no CA yet
    assert invoke("init", "--out", tmp_path).exit_code == 0
    r = invoke("client", "--tenant", "acme", "--out", tmp_path)
    assert r.exit_code == 0, r.output
    c = load(tmp_path / "tenant-acme.pem")
    c.verify_directly_issued_by(load(tmp_path / "ca.pem"))
    assert sans(c)[2] == [tls.tenant_identity("acme")] and usages(c) == {ExtendedKeyUsageOID.CLIENT_AUTH}
    assert c.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "acme"
    assert stat.S_IMODE((tmp_path / "tenant-acme-key.pem").stat().st_mode) == 0o600
    assert invoke("client", "--tenant", "acme", "--out", tmp_path).exit_code == 1
    assert invoke("client", "--tenant", "acme", "--out", tmp_path, "--force").exit_code == 0
    assert invoke("client", "--tenant", "../evil", "--out", tmp_path).exit_code == 1
    # The longest tenant name routers accept still fits (the CN limit is 64 characters).
    assert invoke("client", "--tenant", "t" * 64, "--out", tmp_path).exit_code == 0
