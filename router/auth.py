"""API keys: `mmk_` + 43 characters of urlsafe base64 (256 random bits). Only the sha256 of a key is ever
stored; a high-entropy key needs no salt or slow hash. The router holds a local index (key hash -> tenant)
refreshed in the background, so authentication costs no round trip.

A tenant authenticates with an API key (`authorization: Bearer <key>`) or, where the router asks for them
(RouterSettings.tls_client_ca), a client certificate naming it (ground.tls: SAN URI mmhost://tenant/<t>).
`KeyIndex.authenticate` decides from both; each refusal says which case it is (no credential, not a Bearer
credential, unknown key, ...) and never which tenants exist."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Mapping, Sequence

from ground.tls import peer_identity

KEY_PREFIX = "mmk_"
AUTH_HEADER = "authorization"


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class AuthError(Exception):
    """A refused credential. `case` says which (one of the CASES keys); the message, which goes to the caller
    as UNAUTHENTICATED, says the same in words."""

    def __init__(self, case: str) -> None:
        super().__init__(CASES[case])
        self.case = case


CASES = {
    "no_credential": "no authorization metadata: send 'authorization: Bearer <key>'",
    "not_bearer": "authorization metadata is not a Bearer credential: send 'authorization: Bearer <key>'",
    "unknown_key": "unknown or revoked API key",
    "unknown_cert": "unknown or revoked client certificate",
    "mismatch": "the API key and the client certificate name different tenants",
}


def parse_bearer(metadata: Sequence[tuple[str, str | bytes]] | None) -> str:
    """The key in the (first) `authorization` metadata: `Bearer <key>`, the scheme in any case, whitespace
    around and between tolerated. AuthError("no_credential") without one, AuthError("not_bearer") for another
    scheme or an empty key."""
    for k, v in metadata or ():
        if k.lower() != AUTH_HEADER:
            continue
        if isinstance(v, bytes):
            v = v.decode("latin-1")
        parts = v.split(None, 1)
        if len(parts) != 2 or parts[0].lower() != "bearer" or not parts[1].strip():
            raise AuthError("not_bearer")
        return parts[1].strip()
    raise AuthError("no_credential")


def bearer(metadata: Sequence[tuple[str, str | bytes]] | None) -> str | None:
    """The key in `authorization: Bearer <key>`, or None."""
    try:
        return parse_bearer(metadata)
    except AuthError:
        return None


def cert_tenant(context) -> str | None:
    """The tenant a call's verified client certificate names, or None (no certificate, or not a tenant's)."""
    peer = peer_identity(context)
    return peer.tenant if peer is not None else None


class KeyIndex:
    """key hash -> tenant, replaced whole on each refresh."""

    def __init__(self, by_hash: Mapping[str, str] | None = None) -> None:
        self._by_hash: dict[str, tuple[str, str]] = {}
        self.replace(by_hash or {})

    def replace(self, by_hash: Mapping[str, str]) -> None:
        self._by_hash = {h: (h, t) for h, t in by_hash.items()}
        self._tenants = frozenset(by_hash.values())

    def hashes(self) -> dict[str, str]:
        """key hash -> tenant (a copy): what the fast lane's keys map holds (router/fastlane.py)."""
        return {h: t for h, (_, t) in self._by_hash.items()}

    def known(self, tenant: str) -> bool:
        """A tenant of the registry (one with a key): what a tenant client certificate must name."""
        return tenant in self._tenants

    def __len__(self) -> int:
        return len(self._by_hash)

    def tenant(self, key: str | None) -> str | None:
        if not key or not key.startswith(KEY_PREFIX) or len(key) > 128:
            return None
        h = hash_key(key)
        hit = self._by_hash.get(h)  # keyed by a hash of the key: the lookup's timing reveals nothing usable
        if hit is None:
            return None
        stored, tenant = hit
        return tenant if hmac.compare_digest(stored, h) else None

    def authenticate(self, metadata: Sequence[tuple[str, str | bytes]] | None, cert_tenant: str | None = None) -> str:
        """The caller's tenant, from its API key, its client certificate's tenant (`cert_tenant`), or both when
        they agree; AuthError otherwise. A certificate counts only for a tenant of the registry (a deleted
        tenant's certificate, still valid until it expires, is refused)."""
        if cert_tenant is not None and not self.known(cert_tenant):
            raise AuthError("unknown_cert")
        try:
            key = parse_bearer(metadata)
        except AuthError as e:
            if cert_tenant is not None and e.case == "no_credential":
                return cert_tenant  # the certificate alone
            raise
        tenant = self.tenant(key)
        if tenant is None:
            raise AuthError("unknown_key")
        if cert_tenant is not None and cert_tenant != tenant:
            raise AuthError("mismatch")
        return tenant
