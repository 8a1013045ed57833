"""The tenant registry: tenant name -> hash of its API key and its limits. Two stores behind one interface:

- RedisTenants (`--redis`): keys under a prefix P (default `mmhost:tenants:`):
      P by-name      HASH tenant -> JSON {"key_sha256": ..., "created": ..., "rotated": ...,
                                          "limits": {"tier": "premium", "rate": 50, ...}}
      P by-hash      HASH key sha256 -> tenant (what routers read)
  Both change in one MULTI transaction.
- FileTenants (`--tenants FILE`, the embedded mode): a JSON file {"tenants": {name: {...same record...}}},
  replaced atomically (write a temporary file, rename).

A key is returned once, by create and rotate_key, and never stored.

"limits" holds the tier and only the fields set for this tenant (the rest follow the tier's defaults, see
mmhost/tenancy.py). A record without "limits" (written before limits existed) reads as tier "unlimited":
no quotas, weight 1, the model's own instance count. Routers read the limits for admission; hostds read the
same records (Redis, or the same file in embedded mode) for weights, instances, priority and device shares.
"""

from __future__ import annotations

import abc
import json
import os
import re
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from ground.tenancy import TenantLimits, spec_limits
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
    spec: dict = field(default_factory=dict)  # {"tier": ..., overrides}; {} = tier "unlimited"

    def to_json(self) -> dict:
        d = {"key_sha256": self.key_sha256, "created": self.created, "rotated": self.rotated}
        if self.spec:
            d["limits"] = self.spec
        return d

    @classmethod
    def from_json(cls, name: str, d: dict) -> TenantRecord:
        return cls(name, d["key_sha256"], float(d.get("created", 0)), float(d.get("rotated", 0)),
                   dict(d.get("limits") or {}))

    @property
    def limits(self) -> TenantLimits:
        return spec_limits(self.spec)


def merge_spec(old: dict, tier: str | None, overrides: dict, reset: bool = False) -> dict:
    """The new stored spec: `tier` (when given) and `overrides` (fields given, None = not given) over the old
    one (or over nothing with `reset`). Invalid tier or value: TenantError, nothing changes."""
    spec = {} if reset else dict(old)
    spec["tier"] = tier if tier is not None else old.get("tier", "unlimited")
    spec.update({k: v for k, v in overrides.items() if v is not None})
    try:
        spec_limits(spec)
    except ValueError as e:  # pydantic's ValidationError is a ValueError
        raise TenantError(f"invalid limits: {e}") from None
    return spec


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

    def limits(self) -> dict[str, TenantLimits]:
        """tenant -> limits: what routers (admission) and hostds (weights, instances, shares) read."""
        return {r.name: r.limits for r in self.list()}

    def create(self, name: str, tier: str | None = None, overrides: dict | None = None) -> str:
        check_name(name)
        if self.get(name) is not None:
            raise TenantError(f"tenant {name!r} already exists (rotate-key gives it a new key)")
        given = tier is not None or any(v is not None for v in (overrides or {}).values())
        spec = merge_spec({}, tier, overrides or {}) if given else {}
        key = new_key()
        self._put(TenantRecord(name, hash_key(key), time.time(), spec=spec), None)
        return key

    def rotate_key(self, name: str) -> str:
        old = self._require(name)
        key = new_key()
        self._put(TenantRecord(name, hash_key(key), old.created, time.time(), old.spec), old)
        return key

    def set_limits(self, name: str, tier: str | None = None, overrides: dict | None = None,
                   reset: bool = False) -> TenantRecord:
        """Change a tenant's tier and/or some limits (the others stay); `reset` drops earlier overrides."""
        old = self._require(name)
        rec = replace(old, spec=merge_spec(old.spec, tier, overrides or {}, reset))
        self._put(rec, old)
        return rec

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
