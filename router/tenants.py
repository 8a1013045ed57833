"""The tenant registry: tenant name -> hash of its API key and its limits. Two stores behind one interface:

- RedisTenants (`--redis`), with the model store (`--store`) as its source of truth:
      store  tenants/<tenant>/tenant.json   the record (catalog/tenants_store.py), written first
      Redis, keys under a prefix P (default `mmhost:tenants:`), an index of the store:
      P by-name      HASH tenant -> JSON {"key_sha256": ..., "created": ..., "rotated": ...,
                                          "limits": {"tier": "premium", "rate": 50, ...}}
      P by-hash      HASH key sha256 -> tenant
      P ready        HASH {"at": when the index was last made whole}; absent = Redis lost it (FLUSHALL,
                     a restart without persistence, failover to an empty replica) or it was never built
  Index writes are MULTI transactions. A write with the store that finds `ready` absent rebuilds the whole
  index from the store instead (rebuild(): one transaction, then `ready`). Without a store Redis is the
  only copy (not durable; `mmhost tenant` warns) and a write sets `ready` itself.
- FileTenants (`--tenants FILE`, the embedded mode): a JSON file {"tenants": {name: {...same record...}}},
  replaced atomically (write a temporary file, rename). `mmhost tenant export` writes the same format.

Routers read the registry through a TenantFeed: in the background, with a tight timeout, never on a request.
While `ready` is present Redis's set is the set (a deleted tenant or a rotated key stops at the next
refresh). While it is absent, or Redis is unreachable or slow, the router keeps the last set it knew and
only adds to it: records from the store (when it has one, re-read every few seconds) and whatever Redis holds.

A key is returned once, by create and rotate_key, and never stored.

"limits" holds the tier and only the fields set for this tenant (the rest follow the tier's defaults, see
ground/tenancy.py). A record without "limits" (written before limits existed) reads as tier "unlimited":
no quotas, weight 1, the model's own instance count. Routers read the limits for admission; hostds read the
same records (Redis, or the same file in embedded mode) for weights, instances, priority and device shares.
"""

from __future__ import annotations

import abc
import asyncio
import json
import logging
import os
import re
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

from catalog.tenants_store import TenantStore
from ground.tenancy import TenantLimits, spec_limits
from router.auth import hash_key, new_key

log = logging.getLogger(__name__)

DEFAULT_PREFIX = "mmhost:tenants:"
NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
SHA256 = re.compile(r"^[0-9a-f]{64}$")


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

    def import_records(self, recs: list[TenantRecord]) -> None:
        """Add or replace these records as they are (an export's key hashes and limits)."""
        for rec in recs:
            self._put(rec, self.get(rec.name))

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


class StoreTenants(TenantRegistry):
    """The store's records alone (no Redis): for export, import and writes while Redis is away; the Redis
    index learns of writes at the next `mmhost tenant rebuild`."""

    def __init__(self, store: TenantStore) -> None:
        self.store = store

    def list(self) -> list[TenantRecord]:
        return sorted(_from_store(self.store.all()).values(), key=lambda r: r.name)

    def get(self, name: str) -> TenantRecord | None:
        d = self.store.get(name)
        return TenantRecord.from_json(name, d) if d else None

    def _put(self, rec: TenantRecord, old: TenantRecord | None) -> None:
        self.store.put(rec.name, rec.to_json())

    def _remove(self, rec: TenantRecord) -> None:
        self.store.delete(rec.name)


class RedisTenants(TenantRegistry):
    """Over a redis-py client created with decode_responses=True; `store` is the source of truth (records are
    written there first, and read from there), None = Redis alone (not durable)."""

    def __init__(self, client, prefix: str = DEFAULT_PREFIX, store: TenantStore | None = None) -> None:
        self.r = client
        self.store = store
        self.k_name = f"{prefix}by-name"
        self.k_hash = f"{prefix}by-hash"
        self.k_ready = f"{prefix}ready"

    # -- reads ----------------------------------------------------------------------------------------

    def list(self) -> list[TenantRecord]:
        """With a store: its records, and those only Redis has (made without a store; the next write to one
        moves it into the store). The store wins for a tenant both hold."""
        recs = _parse_index(self.r.hgetall(self.k_name))
        if self.store is not None:
            recs.update(_from_store(self.store.all()))
        return sorted(recs.values(), key=lambda r: r.name)

    def get(self, name: str) -> TenantRecord | None:
        if self.store is not None and (d := self.store.get(name)):
            return TenantRecord.from_json(name, d)
        raw = self.r.hget(self.k_name, name)
        return TenantRecord.from_json(name, json.loads(raw)) if raw else None

    def by_hash(self) -> dict[str, str]:
        return dict(self.r.hgetall(self.k_hash))

    def snapshot(self) -> tuple[bool, dict[str, TenantRecord]]:
        """(is the index whole, i.e. `ready` present; the records Redis holds), in one round trip."""
        p = self.r.pipeline(transaction=True)
        p.exists(self.k_ready)
        p.hgetall(self.k_name)
        ready, raw = p.execute()
        return bool(ready), _parse_index(raw)

    # -- writes: the store first, then the index ------------------------------------------------------

    def _put(self, rec: TenantRecord, old: TenantRecord | None) -> None:
        if self.store is not None:
            self.store.put(rec.name, rec.to_json())
        self._index_one(rec.name, rec)

    def _remove(self, rec: TenantRecord) -> None:
        if self.store is not None:
            self.store.delete(rec.name)
        self._index_one(rec.name, None)

    def import_records(self, recs: list[TenantRecord]) -> None:
        if self.store is None:
            return super().import_records(recs)
        self.store.put_all({rec.name: rec.to_json() for rec in recs})
        self.rebuild()

    def _index_one(self, name: str, rec: TenantRecord | None) -> None:
        """Index one tenant's record (None: remove it), dropping whatever key hash Redis had for it. If the
        index is not whole and there is a store, rebuild it from the store (which holds this change already)
        rather than leave an index that names one tenant and has lost the rest."""
        import redis

        for _ in range(10):
            with self.r.pipeline(transaction=True) as p:
                try:
                    p.watch(self.k_ready, self.k_name)
                    ready = p.exists(self.k_ready)
                    if not ready and self.store is not None:
                        p.reset()
                        self.rebuild()  # holds this change (the store has it) but keeps tenants only Redis had:
                        continue  # apply it to the now whole index too, so a delete of one of those happens
                    cur = p.hget(self.k_name, name)
                    p.multi()
                    if cur:
                        p.hdel(self.k_hash, _hash_of(cur))
                    if rec is None:
                        p.hdel(self.k_name, name)
                    else:
                        p.hset(self.k_name, name, json.dumps(rec.to_json()))
                        p.hset(self.k_hash, rec.key_sha256, name)
                    if not ready:  # no store: Redis is the only copy, so what it holds is the whole set
                        p.hset(self.k_ready, "at", _now_iso())
                    p.execute()
                    return
                except redis.WatchError:
                    continue
        raise TenantError("the tenant index in Redis kept changing under this write; try again")

    def rebuild(self, prune: bool = False) -> TenantRebuild:
        """Make the Redis index the store's records, in one transaction, then mark it whole (`ready`).
        Tenants Redis holds that the store lacks (written by a registry without a store) are kept and
        reported, or removed with `prune`."""
        import redis

        if self.store is None:
            raise TenantError("rebuilding the tenant index needs the store it is rebuilt from (--store)")
        for _ in range(10):
            stored = _from_store(self.store.all())  # again after a conflict: the concurrent write is in the store
            with self.r.pipeline(transaction=True) as p:
                try:
                    p.watch(self.k_name)
                    current = _parse_index(p.hgetall(self.k_name))
                    only_redis = sorted(set(current) - set(stored))
                    final = dict(stored)
                    if not prune:
                        final.update({n: current[n] for n in only_redis})
                    p.multi()
                    p.delete(self.k_name, self.k_hash)
                    if final:
                        p.hset(self.k_name, mapping={n: json.dumps(r.to_json()) for n, r in final.items()})
                        p.hset(self.k_hash, mapping={r.key_sha256: n for n, r in final.items()})
                    p.hset(self.k_ready, "at", _now_iso())
                    p.execute()
                except redis.WatchError:
                    continue
            changed = sorted(n for n in stored if n in current and current[n] != stored[n])
            missing = sorted(set(stored) - set(current))
            return TenantRebuild(sorted(stored), missing, changed, [] if prune else only_redis,
                                 only_redis if prune else [])
        raise TenantError("the tenant index in Redis kept changing during the rebuild; try again")


@dataclass(frozen=True)
class TenantRebuild:
    restored: list[str]  # every tenant in the store, now indexed
    added: list[str]  # ...of which Redis had lost
    changed: list[str]  # ...of which Redis held another key hash or other limits
    kept: list[str]  # in Redis, not in the store: kept (not durable)
    removed: list[str]  # in Redis, not in the store: removed (prune)

    def __str__(self) -> str:
        out = (f"indexed {len(self.restored)} tenant(s) from the store ({len(self.added)} Redis had lost, "
               f"{len(self.changed)} Redis held differently)")
        if self.removed:
            out += f"; removed {len(self.removed)} tenant(s) the store does not have: {', '.join(self.removed)}"
        if self.kept:
            out += (f"; kept {len(self.kept)} tenant(s) that only Redis has (not durable: `mmhost tenant export "
                    f"--redis` then `import --store`, or rebuild with --prune): {', '.join(self.kept)}")
        return out


def _now_iso() -> str:
    return datetime.now(timezone.utc).isoformat()


def _hash_of(raw: str) -> str:
    try:
        return json.loads(raw)["key_sha256"]
    except (ValueError, KeyError, TypeError):
        return ""


def _parse_index(raw: dict[str, str]) -> dict[str, TenantRecord]:
    out = {}
    for n, d in raw.items():
        try:
            out[n] = TenantRecord.from_json(n, json.loads(d))
        except (ValueError, KeyError, TypeError):
            log.warning("tenant index entry %r is unreadable; ignored", n)
    return out


def _from_store(raw: dict[str, dict]) -> dict[str, TenantRecord]:
    return {n: TenantRecord.from_json(n, d) for n, d in raw.items()}


# -- export / import -------------------------------------------------------------------------------------

def export_json(reg: TenantRegistry) -> dict:
    """{"tenants": {name: record}}: key hashes and limits, never keys; the embedded mode's tenants file format."""
    return {"tenants": {r.name: r.to_json() for r in reg.list()}}


def parse_export(raw: dict) -> list[TenantRecord]:
    """Validate an export: names, sha256 hex key hashes, limits. TenantError names the first bad record."""
    tenants = raw.get("tenants") if isinstance(raw, dict) else None
    if not isinstance(tenants, dict):
        raise TenantError('not a tenant export: expected {"tenants": {name: record}}')
    out = []
    for name, d in sorted(tenants.items()):
        check_name(name)
        try:
            rec = TenantRecord.from_json(name, d)
            rec.limits  # noqa: B018 - validates the spec
        except (ValueError, KeyError, TypeError) as e:
            raise TenantError(f"tenant {name!r}: invalid record: {e}") from None
        if not SHA256.match(rec.key_sha256):
            raise TenantError(f"tenant {name!r}: key_sha256 is not a sha256 hex digest (keys are never exported)")
        out.append(rec)
    return out


# -- what a router holds -----------------------------------------------------------------------------------

def next_known(known: dict[str, TenantRecord], whole: bool, indexed: dict[str, TenantRecord],
               stored: dict[str, TenantRecord] | None) -> dict[str, TenantRecord]:
    """The tenant set a router serves after a refresh. `whole` (Redis's `ready` marker present): Redis's set
    is the set, so deletions and rotations take effect. Otherwise (Redis flushed, never built, or not read):
    never remove a tenant; a tenant's record comes from the store (the truth, when read), else from Redis,
    else stays as known."""
    if whole:
        return dict(indexed)
    return {**known, **indexed, **(stored or {})}


class TenantFeed:
    """A router's tenant set (Redis mode), refreshed by the composition root's background loop, never on a
    request. The Redis read is bounded by `timeout_s` (a slow or unreachable Redis leaves the last set in
    place, and one read at a time is in flight); while the index is not whole or not readable, the store's
    records are read at most every `store_every_s` and added (see next_known)."""

    def __init__(self, index: RedisTenants, store: TenantStore | None = None, timeout_s: float = 1.0,
                 store_every_s: float = 10.0) -> None:
        self.index = index
        self.store = store
        self.timeout_s = timeout_s
        self.store_every_s = store_every_s
        self.known: dict[str, TenantRecord] = {}
        self.whole: bool | None = None  # the last read found the index whole
        self._stored: dict[str, TenantRecord] | None = None
        self._stored_at: float | None = None
        self._reading: asyncio.Future | None = None
        self._store_reading: asyncio.Future | None = None

    async def _read_index(self) -> tuple[bool, dict[str, TenantRecord]]:
        if self._reading is None or self._reading.done():  # a slow read still running is awaited, not doubled
            self._reading = asyncio.ensure_future(asyncio.to_thread(self.index.snapshot))
        try:
            return await asyncio.wait_for(asyncio.shield(self._reading), self.timeout_s)
        except asyncio.TimeoutError:
            raise TimeoutError(f"the tenant index took over {self.timeout_s:g}s to answer") from None

    async def _read_store(self, now: float) -> None:
        """Start a read of the store's records when due; take its result when done (waiting at most
        `timeout_s` for it, so a slow store never holds the Redis refreshes up)."""
        assert self.store is not None
        if self._store_reading is None and (self._stored_at is None or now - self._stored_at >= self.store_every_s):
            self._stored_at = now
            self._store_reading = asyncio.ensure_future(asyncio.to_thread(self.store.all))
        if self._store_reading is None:
            return
        await asyncio.wait({self._store_reading}, timeout=self.timeout_s)
        if self._store_reading.done():
            fut, self._store_reading = self._store_reading, None
            try:
                self._stored = _from_store(fut.result())
            except Exception as e:  # noqa: BLE001 - keep the records read before
                log.warning("reading tenants from the store %s failed (keeping the last set): %s",
                            self.store.description, e)

    async def refresh(self, now: float, apply: Callable[[dict[str, str], dict[str, TenantLimits]], None]) -> None:
        """Read, merge, apply(by_hash, limits); then raise the Redis error, if any, for the caller to count."""
        error: Exception | None = None
        try:
            whole, indexed = await self._read_index()
        except Exception as e:  # noqa: BLE001 - unreachable, slow, refused: keep what we know
            whole, indexed, error = False, {}, e
        if not whole and self.store is not None:
            await self._read_store(now)
        if whole != self.whole and (self.whole is not None or not whole):
            log.warning("tenant index in Redis is %s", "whole again" if whole else
                        "not whole (flushed, empty or unreadable): keeping the last known tenants"
                        + (", adding the store's" if self.store is not None else ""))
        self.whole = whole
        if whole:  # a later loss reads the store afresh, never a set read before this
            self._stored, self._stored_at = None, None
        merged = next_known(self.known, whole, indexed, None if whole else self._stored)
        limits = {n: r.limits for n, r in merged.items()}  # an invalid spec fails the refresh: nothing changes
        self.known = merged
        apply({r.key_sha256: n for n, r in merged.items()}, limits)
        if error is not None:
            raise error
