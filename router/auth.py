"""API keys: `mmk_` + 43 characters of urlsafe base64 (256 random bits). Only the sha256 of a key is ever
stored; a high-entropy key needs no salt or slow hash. The router holds a local index (key hash -> tenant)
refreshed in the background, so authentication costs no round trip."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Mapping, Sequence

KEY_PREFIX = "mmk_"
AUTH_HEADER = "authorization"


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def bearer(metadata: Sequence[tuple[str, str | bytes]] | None) -> str | None:
    """The key in `authorization: Bearer <key>`, or None."""
    for k, v in metadata or ():
        if k == AUTH_HEADER and isinstance(v, str):
            scheme, _, key = v.partition(" ")
            if scheme.lower() == "bearer" and key.strip():
                return key.strip()
    return None


class KeyIndex:
    """key hash -> tenant, replaced whole on each refresh."""

    def __init__(self, by_hash: Mapping[str, str] | None = None) -> None:
        self._by_hash: dict[str, tuple[str, str]] = {}
        self.replace(by_hash or {})

    def replace(self, by_hash: Mapping[str, str]) -> None:
        self._by_hash = {h: (h, t) for h, t in by_hash.items()}

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
