"""A development certificate authority and the certificates of one mmhost deployment (`mmhost certs`): for the
demo, the tests and a first deployment. Production issues the same shapes with cert-manager
(deploy/k8s/components/tls).

Files written under one folder (keys mode 0600, certificates 0644):
  ca.pem, ca-key.pem                     the CA (trusted by tenants, routers and hostds)
  router.pem, router-key.pem             router serving certificate (tenant-facing TLS)
  router-client.pem, router-client-key.pem   router -> hostd client certificate (SAN URI mmhost://router,
                                         CN mmhost-router)
  hostd.pem, hostd-key.pem               hostd serving certificate (DNS mmhost-hostd, which routers verify)
  tenant-<t>.pem, tenant-<t>-key.pem     a tenant's client certificate (SAN URI mmhost://tenant/<t>, CN <t>)

Keys are ECDSA P-256 (fast to make, accepted by every gRPC client)."""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import re
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ground.tls import HOSTD_IDENTITY, HOSTD_TLS_NAME, ROUTER_IDENTITY, tenant_identity

DEFAULT_ROUTER_HOSTS = ("127.0.0.1", "localhost", "mmhost-router", "mmhost-router.mmhost",
                        "mmhost-router.mmhost.svc", "mmhost-router.mmhost.svc.cluster.local")
DEFAULT_HOSTD_HOSTS = (HOSTD_TLS_NAME, "127.0.0.1", "localhost")
DEFAULT_DAYS = 365
TENANT_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")  # as router.tenants.NAME

Key = ec.EllipticCurvePrivateKey


class CertsError(Exception):
    """A refusal the command prints as is (files exist, no CA, a bad name)."""


@dataclass(frozen=True)
class Issued:
    cert: x509.Certificate
    key: Key


def new_key() -> Key:
    return ec.generate_private_key(ec.SECP256R1())


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "mmhost"),
                      x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _san(hosts: tuple[str, ...] | list[str], uris: tuple[str, ...] | list[str] = ()) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for h in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            names.append(x509.DNSName(h))
    names += [x509.UniformResourceIdentifier(u) for u in uris]
    return x509.SubjectAlternativeName(names)


def make_ca(cn: str = "mmhost development CA", days: int = DEFAULT_DAYS, now: dt.datetime | None = None) -> Issued:
    now = now or dt.datetime.now(dt.timezone.utc)
    key = new_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn)).issuer_name(_name(cn))
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False, data_encipherment=False,
                                     key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return Issued(cert, key)


def issue(ca: Issued, cn: str, *, hosts: tuple[str, ...] | list[str] = (), uris: tuple[str, ...] | list[str] = (),
          server: bool = False, client: bool = False, days: int = DEFAULT_DAYS,
          now: dt.datetime | None = None) -> Issued:
    """A leaf certificate signed by `ca`: a serving certificate for `hosts` (DNS names or IPs) and/or a client
    certificate whose identity is `cn` and the SAN URIs `uris`."""
    if not (server or client):
        raise ValueError("a certificate is for a server, a client or both")
    now = now or dt.datetime.now(dt.timezone.utc)
    key = new_key()
    usages = ([ExtendedKeyUsageOID.SERVER_AUTH] if server else []) + ([ExtendedKeyUsageOID.CLIENT_AUTH] if client else [])
    b = (
        x509.CertificateBuilder()
        .subject_name(_name(cn)).issuer_name(ca.cert.subject)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(min(now + dt.timedelta(days=days), ca.cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=False, key_cert_sign=False,
                                     crl_sign=False, content_commitment=False, data_encipherment=False,
                                     key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()), critical=False)
    )
    if hosts or uris:
        b = b.add_extension(_san(hosts, uris), critical=False)
    return Issued(b.sign(ca.key, hashes.SHA256()), key)


# ---- files -------------------------------------------------------------------------------------------------------

def cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def key_pem(key: Key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _write(path: Path, data: bytes, mode: int) -> None:
    """Write to a temporary file with its mode set before any byte lands, then rename over `path`: readers
    (servers reloading their certificates) never see a half-written file."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def write_pair(out: Path, stem: str, issued: Issued) -> tuple[Path, Path]:
    """<stem>.pem (0644) and <stem>-key.pem (0600). The key is written first: a server reloading in between
    sees a key that matches no certificate and keeps its old pair (ground.tls)."""
    cert_path, key_path = out / f"{stem}.pem", out / f"{stem}-key.pem"
    _write(key_path, key_pem(issued.key), 0o600)
    _write(cert_path, cert_pem(issued.cert), 0o644)
    return cert_path, key_path


def load_ca(out: Path) -> Issued:
    cert_path, key_path = out / "ca.pem", out / "ca-key.pem"
    if not cert_path.exists() or not key_path.exists():
        raise CertsError(f"no CA in {out}: run `mmhost certs init --out {out}` first")
    key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise CertsError(f"{key_path}: not an EC key made by mmhost certs")
    return Issued(x509.load_pem_x509_certificate(cert_path.read_bytes()), key)


def _refuse_existing(paths: list[Path], force: bool) -> None:
    existing = [p for p in paths if p.exists()]
    if existing and not force:
        raise CertsError("refusing to overwrite " + ", ".join(str(p) for p in existing) + " (use --force)")


INIT_STEMS = ("ca", "router", "router-client", "hostd")


def init(out: Path, router_hosts: tuple[str, ...] | list[str] = DEFAULT_ROUTER_HOSTS,
         hostd_hosts: tuple[str, ...] | list[str] = DEFAULT_HOSTD_HOSTS, days: int = DEFAULT_DAYS,
         force: bool = False) -> dict[str, tuple[Path, Path]]:
    """A new CA and the three certificates of a deployment. Returns stem -> (certificate, key) paths."""
    if days < 1:
        raise CertsError("--days must be at least 1")
    _refuse_existing([out / f"{s}{sfx}" for s in INIT_STEMS for sfx in (".pem", "-key.pem")], force)
    out.mkdir(parents=True, exist_ok=True)
    ca = make_ca(days=days)
    issued = {
        "router": issue(ca, "mmhost-router", hosts=router_hosts, server=True, days=days),
        "router-client": issue(ca, "mmhost-router", uris=[ROUTER_IDENTITY], client=True, days=days),
        "hostd": issue(ca, HOSTD_TLS_NAME, hosts=hostd_hosts, uris=[HOSTD_IDENTITY], server=True, days=days),
    }
    paths = {"ca": write_pair(out, "ca", ca)}
    for stem, it in issued.items():
        paths[stem] = write_pair(out, stem, it)
    return paths


def tenant_client(out: Path, tenant: str, days: int = DEFAULT_DAYS, force: bool = False) -> tuple[Path, Path]:
    """A tenant's client certificate from the CA in `out`: CN and SAN URI mmhost://tenant/<tenant>."""
    if not TENANT_NAME.match(tenant):
        raise CertsError(f"bad tenant name {tenant!r}")
    stem = f"tenant-{tenant}"
    _refuse_existing([out / f"{stem}.pem", out / f"{stem}-key.pem"], force)
    # The CN is the bare name (a CN holds at most 64 characters); the identity servers read is the SAN URI.
    return write_pair(out, stem, issue(load_ca(out), tenant, uris=[tenant_identity(tenant)], client=True, days=days))
