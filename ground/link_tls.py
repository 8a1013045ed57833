"""TLS on the data link (ground/framelink.py), from the same PEM files and with the same checks as gRPC's mutual
TLS between routers and hostds (ground/tls.py), so a deployment with TLS to its hostds keeps the link:

- hostd (`LinkServerTLS`, from `hostd_link_tls(settings)`): serves the link with its serving certificate; with
  tls_client_ca every router must show a certificate from that CA, and a connection whose certificate does not
  name tls_client_identity is closed before anything on it is read (gRPC's PeerCheckInterceptor refuses such
  calls the same way). The files are re-read when they change, at the next connection's handshake.
- routers (`client_context`): present the router's client certificate and verify the hostd's certificate
  against hostd_ca and by name (hostd_tls_name), as gRPC's `grpc.ssl_target_name_override` does. Built again
  when ClientTLSFiles' generation changes (router/forward.py), and the old links are closed then.

TLS has no half-close, so a router ends its calls with the link's END message instead (ground/framelink.py)."""

from __future__ import annotations

import asyncio
import logging
import ssl
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ground.tls import PathLike, PeerIdentity, TLSFiles, hostd_peer_check

if TYPE_CHECKING:
    from ground.settings import HostdSettings

log = logging.getLogger(__name__)
HANDSHAKE_S = 10.0  # a connection that has not finished its handshake by then is closed
# hostd upgrades each accepted connection (StreamWriter.start_tls, Python 3.11+); on 3.10 a hostd with TLS opens
# no data port, and routers call it on gRPC streams
SERVER_SUPPORTED = sys.version_info >= (3, 11)


def peer_of(cert: dict[str, Any] | None) -> PeerIdentity | None:
    """The identity in a verified peer certificate as `ssl` reports it (`getpeercert()`), or None."""
    if not cert:
        return None
    cn = next((v for rdn in cert.get("subject", ()) for k, v in rdn if k == "commonName"), None)
    sans = tuple(dict.fromkeys(str(v) for _, v in cert.get("subjectAltName", ())))
    return PeerIdentity(common_name=cn, sans=sans)


def _server_context(files: TLSFiles) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(files.cert_path, files.key_path)
    if files.ca_path is not None:
        ctx.load_verify_locations(cafile=files.ca_path)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


class LinkServerTLS:
    """hostd's side: `context()` for each new connection (the files as they are now), `allowed(peercert)` after
    its handshake."""

    def __init__(self, cert_path: PathLike, key_path: PathLike, client_ca_path: PathLike | None = None,
                 check: Callable[[PeerIdentity | None], bool] | None = None) -> None:
        self._files = TLSFiles(cert_path, key_path, client_ca_path)  # raises at start, as gRPC's credentials do
        self._context = _server_context(self._files)
        self._check = check

    def context(self) -> ssl.SSLContext:
        """The context for a new connection: rebuilt when the files changed and the new ones load (a rotation
        caught half-way keeps the previous certificate until the files agree)."""
        if self._files.changed():
            try:
                self._context = _server_context(self._files)
            except (OSError, ssl.SSLError) as e:
                log.warning("data link TLS files changed but cannot be loaded yet (%s); keeping the previous ones", e)
        return self._context

    def allowed(self, peercert: dict[str, Any] | None) -> bool:
        return self._check is None or self._check(peer_of(peercert))


def hostd_link_tls(s: HostdSettings) -> LinkServerTLS | None:
    """The data link's TLS for a hostd's settings, matching its gRPC port (ground.tls.hostd_credentials, which
    has already refused what is not allowed): None when hostd serves plaintext."""
    if s.tls_cert is None or s.tls_key is None:
        return None
    return LinkServerTLS(s.tls_cert, s.tls_key, s.tls_client_ca, hostd_peer_check(s))


def client_context(ca_path: PathLike, cert_path: PathLike, key_path: PathLike) -> ssl.SSLContext:
    """A router's context for links to hostds: trusts `ca_path`, presents the client certificate, checks the
    host name given as server_hostname when connecting."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(ca_path))
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert_path, key_path)
    return ctx


async def accept(writer: asyncio.StreamWriter, tls: LinkServerTLS) -> bool:
    """Upgrade a new connection to TLS and check its peer; False (the caller closes it) when the handshake
    fails or the peer is not allowed."""
    peer = writer.get_extra_info("peername")
    if sys.version_info < (3, 11):  # not SERVER_SUPPORTED: hostd opened no data port (spelled out for mypy)
        return False
    try:
        await writer.start_tls(tls.context(), ssl_handshake_timeout=HANDSHAKE_S)
    except (OSError, asyncio.TimeoutError) as e:  # ssl.SSLError is an OSError
        log.warning("data link from %s: TLS handshake failed (%s); closing it", peer, e)
        return False
    if not tls.allowed(writer.get_extra_info("peercert")):
        log.warning("data link from %s: its certificate does not name an allowed peer; closing it", peer)
        return False
    return True


__all__ = ["HANDSHAKE_S", "SERVER_SUPPORTED", "LinkServerTLS", "accept", "client_context", "hostd_link_tls", "peer_of"]
