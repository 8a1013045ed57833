"""TLS for both gRPC hops, from PEM files that are re-read when they change (cert-manager renewals, a secret
update, `mmhost certs`), so certificates rotate without a restart.

- Servers: `server_credentials(...)` (tenant-facing TLS on the router; mutual TLS on hostd with
  `require_client_cert=True`). gRPC asks the fetcher for a new configuration at every TLS handshake; it answers
  a new one only when a file's (mtime, size, inode) changed and the new key matches the new certificate, so a
  half-written rotation keeps the old pair until both files agree. Connections already open keep their session.
- Clients (router -> hostd): `ClientTLSFiles(...).credentials()` gives channel credentials and a generation
  that grows when the files change; a caller that sees a new generation builds new channels (the old ones
  would reconnect with the old certificate). `channel_credentials(...)` is the one-shot form.
- Identities (what `mmhost certs` and cert-manager put in certificates): `ROUTER_IDENTITY` on routers' client
  certificates, `tenant_identity(t)` on tenants' client certificates, `HOSTD_TLS_NAME` on hostd serving
  certificates (hostds are dialled by pod IP, so the router checks this name instead:
  `target_name_options()`). `peer_identity(context)` reads the verified peer certificate of a call;
  `PeerCheckInterceptor` refuses calls whose peer certificate does not pass a check, before any handler (and
  so any `mmhost-tenant` metadata) runs.
- From settings (what the servers call): `hostd_credentials` + `hostd_interceptors`, `router_credentials`
  (+ `router_client_cert_credentials` for a port that requires tenant certificates), `router_to_hostd`,
  `add_port`; plaintext only when `plaintext=true` was asked for (TLSConfigError otherwise).
  `health_only_server` serves the health service alone in plaintext on `health_port` for kubelet probes."""

from __future__ import annotations

import inspect
import logging
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
from grpc import aio

if TYPE_CHECKING:
    from ground.settings import HostdSettings, RouterSettings

log = logging.getLogger(__name__)

# Identities carried in certificates (SAN URIs; the CN carries the same string). One place for what
# `mmhost certs`, cert-manager's Certificates and the servers' checks all agree on.
ROUTER_IDENTITY = "mmhost://router"
HOSTD_IDENTITY = "mmhost://hostd"
TENANT_IDENTITY_PREFIX = "mmhost://tenant/"
HOSTD_TLS_NAME = "mmhost-hostd"  # DNS name every hostd serving certificate carries; routers verify it

PathLike = str | os.PathLike


def tenant_identity(tenant: str) -> str:
    return TENANT_IDENTITY_PREFIX + tenant


def target_name_options(name: str = HOSTD_TLS_NAME) -> list[tuple[str, str]]:
    """Channel options that verify the server certificate against `name` whatever address is dialled (routers
    dial hostds by pod IP, which no certificate issued ahead of time can name)."""
    return [("grpc.ssl_target_name_override", name)]


# ---- files -------------------------------------------------------------------------------------------------------

def _stamp(paths: Sequence[Path]) -> tuple:
    out = []
    for p in paths:
        st = os.stat(p)  # follows symlinks: Kubernetes secret volumes swap a `..data` link
        out.append((st.st_mtime_ns, st.st_size, st.st_ino))
    return tuple(out)


def key_matches_cert(cert_pem: bytes, key_pem: bytes) -> bool:
    """True when the private key is the one the (first) certificate in the chain was issued for."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    cert = x509.load_pem_x509_certificate(cert_pem)
    key = serialization.load_pem_private_key(key_pem, password=None)
    fmt = serialization.PublicFormat.SubjectPublicKeyInfo
    enc = serialization.Encoding.DER
    return bool(cert.public_key().public_bytes(enc, fmt) == key.public_key().public_bytes(enc, fmt))


@dataclass(frozen=True)
class _Material:
    cert: bytes
    key: bytes
    ca: bytes | None


class TLSFiles:
    """A certificate, its key and optionally a CA bundle, re-read when any of them changes on disk."""

    def __init__(self, cert_path: PathLike, key_path: PathLike, ca_path: PathLike | None = None) -> None:
        self.cert_path, self.key_path = Path(cert_path), Path(key_path)
        self.ca_path = Path(ca_path) if ca_path is not None else None
        self._stamp: tuple | None = None
        self._lock = threading.Lock()  # gRPC core may run fetchers for concurrent handshakes on several threads
        self.material = self._read()  # raises at start: a server must not come up without its certificate
        self._stamp = self._current_stamp()

    def _paths(self) -> list[Path]:
        return [self.cert_path, self.key_path] + ([self.ca_path] if self.ca_path is not None else [])

    def _current_stamp(self) -> tuple:
        return _stamp(self._paths())

    def _read(self) -> _Material:
        cert, key = self.cert_path.read_bytes(), self.key_path.read_bytes()
        ca = self.ca_path.read_bytes() if self.ca_path is not None else None
        if not key_matches_cert(cert, key):
            raise ValueError(f"{self.key_path} is not the key of {self.cert_path}")
        return _Material(cert, key, ca)

    def changed(self) -> bool:
        """Re-read when the files changed; True when new material was taken. A rotation caught half-way (files
        missing, unreadable or a key that does not match the certificate) keeps the old material and is retried
        at the next call."""
        with self._lock:
            try:
                stamp = self._current_stamp()
                if stamp == self._stamp:
                    return False
                material = self._read()
            except (OSError, ValueError) as e:
                log.warning("TLS files changed but cannot be used yet (%s); keeping the previous ones", e)
                return False
            self.material, self._stamp = material, stamp
            log.info("TLS certificate reloaded from %s", self.cert_path)
            return True


# ---- servers -----------------------------------------------------------------------------------------------------

def server_credentials(cert_path: PathLike, key_path: PathLike, client_ca_path: PathLike | None = None,
                       require_client_cert: bool = False) -> grpc.ServerCredentials:
    """TLS server credentials that follow the files: each new handshake uses the files as they are now.
    With `client_ca_path`, client certificates are verified against it; with `require_client_cert` a client
    without one (or with one the CA did not sign) fails the handshake."""
    if require_client_cert and client_ca_path is None:
        raise ValueError("require_client_cert needs client_ca_path")
    files = TLSFiles(cert_path, key_path, client_ca_path)

    def config() -> Any:
        m = files.material
        return grpc.ssl_server_certificate_configuration([(m.key, m.cert)], root_certificates=m.ca)

    def fetch() -> Any:
        # Called by gRPC core on every handshake; must not raise. None = keep the current configuration.
        try:
            return config() if files.changed() else None
        except Exception:  # noqa: BLE001 - a failed reload must not break handshakes with the old certificate
            log.exception("TLS reload failed; keeping the previous certificate")
            return None

    return grpc.dynamic_ssl_server_credentials(config(), fetch, require_client_authentication=require_client_cert)


# ---- clients -----------------------------------------------------------------------------------------------------

def channel_credentials(ca_path: PathLike, cert_path: PathLike | None = None,
                        key_path: PathLike | None = None) -> grpc.ChannelCredentials:
    """Channel credentials that trust `ca_path`, presenting a client certificate when `cert_path`/`key_path`
    are given (both or neither). Read once: see ClientTLSFiles for rotation."""
    if (cert_path is None) != (key_path is None):
        raise ValueError("a client certificate needs both cert_path and key_path")
    if cert_path is None:
        return grpc.ssl_channel_credentials(root_certificates=Path(ca_path).read_bytes())
    assert key_path is not None
    m = TLSFiles(cert_path, key_path, ca_path).material
    return grpc.ssl_channel_credentials(root_certificates=m.ca, private_key=m.key, certificate_chain=m.cert)


class ClientTLSFiles:
    """The router's side of mutual TLS to hostds, following the files: `credentials()` returns the channel
    credentials for the files as they are now and a generation number that grows at each change. Channels
    built under an older generation should be replaced (gRPC reuses a channel's credentials when it
    reconnects). Call it when building a channel, or periodically."""

    def __init__(self, ca_path: PathLike, cert_path: PathLike, key_path: PathLike) -> None:
        self._files = TLSFiles(cert_path, key_path, ca_path)
        self.generation = 0
        self._creds = self._build()

    def _build(self) -> grpc.ChannelCredentials:
        m = self._files.material
        return grpc.ssl_channel_credentials(root_certificates=m.ca, private_key=m.key, certificate_chain=m.cert)

    @property
    def paths(self) -> tuple[Path, Path, Path]:
        """(CA bundle, certificate, key): what the data link's TLS loads (ground/link_tls.py)."""
        f = self._files
        assert f.ca_path is not None
        return f.ca_path, f.cert_path, f.key_path

    def credentials(self) -> tuple[grpc.ChannelCredentials, int]:
        if self._files.changed():
            self.generation += 1
            self._creds = self._build()
        return self._creds, self.generation


# ---- peers -------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PeerIdentity:
    """The verified client certificate of a call (gRPC fills the auth context only after verification)."""

    common_name: str | None
    sans: tuple[str, ...]  # subject alternative names of every type gRPC reports (URI, DNS, IP, email)

    def has(self, identity: str) -> bool:
        return identity in self.sans or self.common_name == identity

    @property
    def tenant(self) -> str | None:
        """The tenant a tenant client certificate names (SAN URI mmhost://tenant/<t>), else None."""
        for s in self.sans:
            if s.startswith(TENANT_IDENTITY_PREFIX) and len(s) > len(TENANT_IDENTITY_PREFIX):
                return s[len(TENANT_IDENTITY_PREFIX):]
        return None


def _decode(values: Sequence[bytes] | None) -> list[str]:
    return [v.decode() if isinstance(v, bytes) else str(v) for v in values or ()]


def peer_identity(context: aio.ServicerContext | grpc.ServicerContext) -> PeerIdentity | None:
    """The peer's verified certificate identity, or None when the call came without one (plaintext, or TLS
    without a client certificate)."""
    auth = context.auth_context() or {}
    cn = _decode(auth.get("x509_common_name"))
    sans = tuple(dict.fromkeys(_decode(auth.get("x509_subject_alternative_name"))
                               + _decode(auth.get("x509_uri_subject_alternative_name"))))
    if not cn and not sans:
        return None
    return PeerIdentity(common_name=cn[0] if cn else None, sans=sans)


def require_identity(identity: str) -> Callable[[PeerIdentity | None], bool]:
    """A check for PeerCheckInterceptor: the peer certificate carries `identity` (e.g. ROUTER_IDENTITY)."""
    return lambda peer: peer is not None and peer.has(identity)


class PeerCheckInterceptor(aio.ServerInterceptor):
    """Refuses (UNAUTHENTICATED) every call whose peer certificate fails `check`, before the handler runs and
    so before any metadata is trusted. The TLS handshake already verified the certificate's chain; this
    checks who it names, so a tenant certificate from the same CA cannot call a hostd. Health checks
    (`exempt`) are answered without a certificate only if listed there."""

    def __init__(self, check: Callable[[PeerIdentity | None], bool], exempt: Sequence[str] = ()) -> None:
        self._check = check
        self._exempt = frozenset(exempt)
        self._wrapped: dict[int, tuple[object, grpc.RpcMethodHandler]] = {}

    def _ok(self, context: Any) -> bool:
        return self._check(peer_identity(context))

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None or handler_call_details.method in self._exempt:
            return handler
        hit = self._wrapped.get(id(handler))
        if hit is not None and hit[0] is handler:
            return hit[1]
        wrapped = self._wrap(handler)
        if len(self._wrapped) > 1024:
            self._wrapped.clear()
        self._wrapped[id(handler)] = (handler, wrapped)
        return wrapped

    def _wrap(self, h: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        ok = self._ok
        msg = "a client certificate naming an allowed peer is required"
        kw = {"request_deserializer": h.request_deserializer, "response_serializer": h.response_serializer}
        if h.unary_unary is not None or h.stream_unary is not None:
            inner = h.unary_unary or h.stream_unary

            async def single(request, context):
                if not ok(context):
                    await context.abort(grpc.StatusCode.UNAUTHENTICATED, msg)
                return await inner(request, context)

            make = grpc.unary_unary_rpc_method_handler if h.unary_unary else grpc.stream_unary_rpc_method_handler
            return make(single, **kw)
        inner_s = h.unary_stream or h.stream_stream

        async def streaming(request, context):
            if not ok(context):
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, msg)
            out = inner_s(request, context)
            if inspect.isasyncgen(out):  # an async-generator handler
                async for r in out:
                    yield r
            else:  # a handler that writes with context.write() and returns nothing
                await out

        make_s = grpc.unary_stream_rpc_method_handler if h.unary_stream else grpc.stream_stream_rpc_method_handler
        return make_s(streaming, **kw)


# ---- from settings: what the servers call -----------------------------------------------------------------------

class TLSConfigError(ValueError):
    """Settings that would serve without the TLS they ask for, or plaintext nobody asked for."""


def listen_credentials(role: str, cert: Path | None, key: Path | None, plaintext: bool,
                       client_ca: Path | None = None, require_client_cert: bool = False) -> grpc.ServerCredentials | None:
    """The credentials of a listening port, or None for plaintext, which must have been asked for."""
    if (cert is None) != (key is None):
        raise TLSConfigError(f"{role}: tls_cert and tls_key go together")
    if cert is None:
        if not plaintext:
            raise TLSConfigError(f"{role}: no tls_cert/tls_key; set plaintext=true to serve without TLS "
                                 "(demo and tests only)")
        if client_ca is not None:
            raise TLSConfigError(f"{role}: tls_client_ca needs tls_cert/tls_key")
        return None
    if plaintext:
        raise TLSConfigError(f"{role}: plaintext=true and tls_cert both set; pick one")
    assert key is not None
    return server_credentials(cert, key, client_ca, require_client_cert=require_client_cert)


def hostd_credentials(s: HostdSettings) -> grpc.ServerCredentials | None:
    """hostd's port: mutual TLS when tls_client_ca is set (every caller shows a certificate from that CA).
    TLS without it looks protected but is not: hostd trusts the mmhost-tenant metadata of whoever calls, so
    any TLS client could act as any tenant. That takes an explicit tls_without_client_auth=true (or dev_mode)."""
    if s.tls_cert is not None and s.tls_client_ca is None and not (s.tls_without_client_auth or s.dev_mode):
        raise TLSConfigError("hostd: tls_cert without tls_client_ca lets any TLS caller act as any tenant "
                             "(mmhost-tenant); set tls_client_ca (routers' certificates, mutual TLS), or "
                             "tls_without_client_auth=true if only routers can reach this port")
    return listen_credentials("hostd", s.tls_cert, s.tls_key, s.plaintext, s.tls_client_ca,
                              require_client_cert=s.tls_client_ca is not None)


def hostd_peer_check(s: HostdSettings) -> Callable[[PeerIdentity | None], bool] | None:
    """Who may call a hostd, on its gRPC port and its data link alike: with mutual TLS, a certificate naming
    tls_client_identity (a router); None (anyone who reaches it) without tls_client_ca."""
    return require_identity(s.tls_client_identity) if s.tls_client_ca is not None else None


def hostd_interceptors(s: HostdSettings) -> list[aio.ServerInterceptor]:
    """Put first in hostd's interceptors: with mutual TLS, calls whose certificate does not name
    tls_client_identity (a router) are refused before any handler reads mmhost-tenant."""
    check = hostd_peer_check(s)
    return [] if check is None else [PeerCheckInterceptor(check)]


def router_credentials(s: RouterSettings) -> grpc.ServerCredentials | None:
    """The router's tenant-facing port (listen): tenants authenticate with an API key. With tls_client_ca and
    no tls_client_listen, this port requires a tenant client certificate instead (read it with
    peer_identity(context).tenant; an API key may come along and must name the same tenant): gRPC's Python
    API asks a client for a certificate only when it requires one, so an optional one cannot be had."""
    only_certs = s.tls_client_ca is not None and not s.tls_client_listen
    return listen_credentials("router", s.tls_cert, s.tls_key, s.plaintext, s.tls_client_ca if only_certs else None,
                              require_client_cert=only_certs)


def router_client_cert_credentials(s: RouterSettings) -> grpc.ServerCredentials | None:
    """tls_client_listen: the router's second tenant port, which requires a tenant client certificate signed by
    tls_client_ca (next to listen, which keeps API keys); None when off."""
    if not s.tls_client_listen:
        return None
    if s.tls_client_ca is None or s.tls_cert is None or s.tls_key is None:
        raise TLSConfigError("router: tls_client_listen needs tls_client_ca, tls_cert and tls_key")
    return server_credentials(s.tls_cert, s.tls_key, s.tls_client_ca, require_client_cert=True)


def router_to_hostd(s: RouterSettings) -> tuple[ClientTLSFiles | None, list[tuple[str, str]]]:
    """How a router dials hostds: (client TLS files, extra channel options), or (None, []) for plaintext when
    hostd_ca is unset. With TLS, build channels with grpc.aio.secure_channel(addr, files.credentials()[0],
    options=... + the options returned here), and rebuild them when the generation changes."""
    if s.hostd_ca is None:
        if s.hostd_client_cert is not None or s.hostd_client_key is not None:
            raise TLSConfigError("router: hostd_client_cert/key need hostd_ca")
        return None, []
    if s.hostd_client_cert is None or s.hostd_client_key is None:
        raise TLSConfigError("router: hostd_ca needs hostd_client_cert and hostd_client_key (mutual TLS)")
    return ClientTLSFiles(s.hostd_ca, s.hostd_client_cert, s.hostd_client_key), target_name_options(s.hostd_tls_name)


def add_port(server: aio.Server, address: str, creds: grpc.ServerCredentials | None) -> int:
    """Bind `address` with TLS credentials, or in plaintext when `creds` is None."""
    return server.add_insecure_port(address) if creds is None else server.add_secure_port(address, creds)


def health_only_server(health_servicer: Any, host: str, port: int) -> tuple[aio.Server, int]:
    """A plaintext server with the gRPC health service alone (health_port), for the kubelet's probes, which
    cannot speak TLS. Pass the main server's HealthServicer so draining (NOT_SERVING) shows on both. Returns the
    server (not started; start and stop it with the main one) and the bound port."""
    from grpc_health.v1 import health_pb2_grpc

    server = aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    return server, server.add_insecure_port(f"{host}:{port}")
