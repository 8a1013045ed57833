"""The tenant registry: tenant name -> hash of its API key. Two stores behind one interface:

- RedisTenants (`--redis`): keys under a prefix P (default `mmhost:tenants:`):
      P by-name      HASH tenant -> JSON {"key_sha256": ..., "created": ..., "rotated": ...}
      P by-hash      HASH key sha256 -> tenant (what routers read)
  Both change in one MULTI transaction.
- FileTenants (`--tenants FILE`, the embedded mode): a JSON file {"tenants": {name: {...same record...}}},
  replaced atomically (write a temporary file, rename).

A key is returned once, by create and rotate_key, and never stored.
"""

from __future__ import annotations

import abc
import json
import os
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from router.auth import hash_key, new_key

DEFAULT_PREFIX = "mmhost:tenants:"
NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class TenantError(Exception):
    """Bad name, duplicate, unknown tenant: the message says which."""


@dataclass(frozen=True)
class TenantRecord:
    name: str
    key_sha256: str
    created: float
    rotated: float = 0.0

    def to_json(self) -> dict:
        return {"key_sha256": self.key_sha256, "created": self.created, "rotated": self.rotated}

    @classmethod
    def from_json(cls, name: str, d: dict) -> TenantRecord:
        return cls(name, d["key_sha256"], float(d.get("created", 0)), float(d.get("rotated", 0)))


def check_name(name: str) -> str:
    if not NAME.match(name):
        raise TenantError(f"tenant name {name!r} is invalid: use 1-64 of A-Z a-z 0-9 _ . -")
    return name


class TenantRegistry(abc.ABC):
    @abc.abstractmethod
    def list(self) -> list[TenantRecord]: ...

    @abc.abstractmethod
    def _put(self, rec: TenantRecord, old: TenantRecord | None) -> None: ...

    @abc.abstractmethod
    def _remove(self, rec: TenantRecord) -> None: ...

    @abc.abstractmethod
    def get(self, name: str) -> TenantRecord | None: ...

    def by_hash(self) -> dict[str, str]:
        """key sha256 -> tenant: what a router's KeyIndex holds."""
        return {r.key_sha256: r.name for r in self.list()}

    def create(self, name: str) -> str:
        check_name(name)
        if self.get(name) is not None:
            raise TenantError(f"tenant {name!r} already exists (rotate-key gives it a new key)")
        key = new_key()
        self._put(TenantRecord(name, hash_key(key), time.time()), None)
        return key

    def rotate_key(self, name: str) -> str:
        old = self._require(name)
        key = new_key()
        self._put(TenantRecord(name, hash_key(key), old.created, time.time()), old)
        return key

    def delete(self, name: str) -> None:
        self._remove(self._require(name))

    def _require(self, name: str) -> TenantRecord:
        rec = self.get(check_name(name))
        if rec is None:
            raise TenantError(f"tenant {name!r} not found")
        return rec


class FileTenants(TenantRegistry):
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def _read(self) -> dict[str, TenantRecord]:
        try:
            raw = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            raise TenantError(f"tenants file {self.path} is unreadable: {e}") from e
        return {n: TenantRecord.from_json(n, d) for n, d in raw.get("tenants", {}).items()}

    def _write(self, recs: dict[str, TenantRecord]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        body = json.dumps({"tenants": {n: r.to_json() for n, r in sorted(recs.items())}}, indent=1)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".tenants-")
        with os.fdopen(fd, "w") as f:
            f.write(body + "\n")
        os.chmod(tmp, 0o600)
        os.replace(tmp, self.path)

    def list(self) -> list[TenantRecord]:
        return sorted(self._read().values(), key=lambda r: r.name)

    def get(self, name: str) -> TenantRecord | None:
        return self._read().get(name)

    def _put(self, rec: TenantRecord, old: TenantRecord | None) -> None:
        recs = self._read()
        recs[rec.name] = rec
        self._write(recs)

    def _remove(self, rec: TenantRecord) -> None:
        recs = self._read()
        recs.pop(rec.name, None)
        self._write(recs)

    def mtime(self) -> float:
        try:
            return self.path.stat().st_mtime_ns
        except FileNotFoundError:
            return 0


class RedisTenants(TenantRegistry):
    """Over a redis-py client created with decode_responses=True."""

    def __init__(self, client, prefix: str = DEFAULT_PREFIX) -> None:
        self.r = client
        self.k_name = f"{prefix}by-name"
        self.k_hash = f"{prefix}by-hash"

    def list(self) -> list[TenantRecord]:
        return sorted((TenantRecord.from_json(n, json.loads(d)) for n, d in self.r.hgetall(self.k_name).items()),
                      key=lambda r: r.name)

    def get(self, name: str) -> TenantRecord | None:
        d = self.r.hget(self.k_name, name)
        return TenantRecord.from_json(name, json.loads(d)) if d else None

    def by_hash(self) -> dict[str, str]:
        return dict(self.r.hgetall(self.k_hash))

    def _put(self, rec: TenantRecord, old: TenantRecord | None) -> None:
        p = self.r.pipeline(transaction=True)
        if old is not None:
            p.hdel(self.k_hash, old.key_sha256)
        p.hset(self.k_name, rec.name, json.dumps(rec.to_json()))
        p.hset(self.k_hash, rec.key_sha256, rec.name)
        p.execute()

    def _remove(self, rec: TenantRecord) -> None:
        p = self.r.pipeline(transaction=True)
        p.hdel(self.k_hash, rec.key_sha256)
        p.hdel(self.k_name, rec.name)
        p.execute()
