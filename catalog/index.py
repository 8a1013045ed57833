"""The catalog: resolve (tenant, model, version or policy) to a manifest.

Object storage is the source of truth (manifests and policy.json written by `mmhost upload` and
`mmhost catalog set-policy`). Two implementations of one interface:

- StorageCatalog reads the store directly: the embedded mode, no Redis.
- RedisCatalog reads a Redis index of the same data, so many routers can look up fast. `rebuild()`
  recreates the whole index from storage at any time (losing Redis loses nothing); `index_version()` and
  `index_policy()` are called after uploads and policy changes.

RedisCatalog, documented behaviour:
- While the index has never been built (or Redis was flushed: the `ready` marker is gone), lookups read
  through to storage, so a flushed Redis degrades to embedded-mode speed, never to "model not found".
  Once built, the index is authoritative: a miss is a miss, and unknown names cost storage nothing.
- Redis unreachable: CatalogUnavailable naming the Redis URL and the cause, within the socket timeouts
  (a couple of seconds), never a hang. Callers decide whether to fall back to a StorageCatalog.

Redis keys, under a configurable prefix P (names are restricted to [A-Za-z0-9_.-], so ':' is safe):
    P ready                       last rebuild time (ISO 8601); absent = index not built
    P tenants                     SET of tenants
    P t:<tenant>:models           SET of models
    P t:<tenant>:m:<model>:versions   SET of complete versions
    P t:<tenant>:m:<model>:v:<version> manifest JSON
    P t:<tenant>:m:<model>:policy     VersionPolicy JSON (absent = latest)
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterator
from datetime import datetime, timezone

from ground.manifest import ModelManifest, VersionPolicy, version_sort_key
from catalog.repository import ModelNotFound, ModelRepository, resolve_manifest

DEFAULT_PREFIX = "mmhost:catalog:"


class CatalogUnavailable(Exception):
    """The catalog index (Redis) cannot be reached. The message names it and the cause."""


class Catalog(abc.ABC):
    """Read side of the model catalog. ModelNotFound for unknown tenants, models and versions alike."""

    @abc.abstractmethod
    def tenants(self) -> list[str]: ...

    @abc.abstractmethod
    def models(self, tenant: str) -> list[str]: ...

    @abc.abstractmethod
    def versions(self, tenant: str, model: str) -> list[str]:
        """Complete versions, oldest first."""

    @abc.abstractmethod
    def manifest(self, tenant: str, model: str, version: str) -> ModelManifest: ...

    @abc.abstractmethod
    def policy(self, tenant: str, model: str) -> VersionPolicy: ...

    def resolve(self, tenant: str, model: str, version: str | None = None, u: float | None = None) -> ModelManifest:
        """The manifest a request for (tenant, model[, version]) gets; `u` is the uniform draw for splits."""
        return resolve_manifest(self._versions_and_policy, self.manifest, tenant, model, version, u)

    def _versions_and_policy(self, tenant: str, model: str) -> tuple[list[str], VersionPolicy]:
        return self.versions(tenant, model), self.policy(tenant, model)

    def entries(self, tenant: str | None = None) -> Iterator[tuple[str, str, list[str], VersionPolicy]]:
        """(tenant, model, versions, policy) for every stored model, for listings."""
        for t in [tenant] if tenant else self.tenants():
            for m in self.models(t):
                vs, pol = self._versions_and_policy(t, m)
                if vs:
                    yield t, m, vs, pol


class StorageCatalog(Catalog):
    """Embedded mode: every lookup reads the store."""

    def __init__(self, repo: ModelRepository) -> None:
        self.repo = repo

    def tenants(self) -> list[str]:
        return self.repo.tenants()

    def models(self, tenant: str) -> list[str]:
        return self.repo.models(tenant)

    def versions(self, tenant: str, model: str) -> list[str]:
        return self.repo.versions(tenant, model)

    def manifest(self, tenant: str, model: str, version: str) -> ModelManifest:
        return self.repo.manifest(tenant, model, version)

    def policy(self, tenant: str, model: str) -> VersionPolicy:
        return self.repo.policy(tenant, model)


def connect_redis(url: str, timeout_s: float = 2.0):
    """A redis-py client that fails within about `timeout_s` when Redis is down, never hangs."""
    import redis
    from redis.backoff import ExponentialBackoff
    from redis.retry import Retry

    return redis.Redis.from_url(
        url,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=Retry(ExponentialBackoff(cap=0.2, base=0.02), retries=1),
        decode_responses=True,
        health_check_interval=30,
    )


def _redis_location(client) -> str:
    kw = client.connection_pool.connection_kwargs
    if "path" in kw:
        return f"redis unix socket {kw['path']}"
    return f"redis://{kw.get('host', '?')}:{kw.get('port', '?')}/{kw.get('db', 0)}"


class RedisCatalog(Catalog):
    def __init__(self, client, repo: ModelRepository, prefix: str = DEFAULT_PREFIX) -> None:
        self.r = client
        self.repo = repo
        self.prefix = prefix
        self.location = _redis_location(client)
        self._fallback = StorageCatalog(repo)

    # -- keys -----------------------------------------------------------------------------------------

    def _k_ready(self) -> str:
        return f"{self.prefix}ready"

    def _k_tenants(self) -> str:
        return f"{self.prefix}tenants"

    def _k_models(self, t: str) -> str:
        return f"{self.prefix}t:{t}:models"

    def _k_versions(self, t: str, m: str) -> str:
        return f"{self.prefix}t:{t}:m:{m}:versions"

    def _k_manifest(self, t: str, m: str, v: str) -> str:
        return f"{self.prefix}t:{t}:m:{m}:v:{v}"

    def _k_policy(self, t: str, m: str) -> str:
        return f"{self.prefix}t:{t}:m:{m}:policy"

    def _call(self, what: str, fn):
        import redis

        try:
            return fn()
        except (redis.ConnectionError, redis.TimeoutError) as e:
            raise CatalogUnavailable(f"catalog index at {self.location} unreachable while {what}: {e}") from e
        except redis.ResponseError as e:  # e.g. NOAUTH, WRONGTYPE
            raise CatalogUnavailable(f"catalog index at {self.location} refused {what}: {e}") from e

    # -- state ----------------------------------------------------------------------------------------

    def ready(self) -> bool:
        """True once rebuild() has run since Redis last lost its data."""
        return bool(self._call("checking the index", lambda: self.r.exists(self._k_ready())))

    def _source(self) -> Catalog | None:
        """The storage fallback while the index is not built, else None (read Redis)."""
        return None if self.ready() else self._fallback

    # -- reads ----------------------------------------------------------------------------------------

    def tenants(self) -> list[str]:
        if src := self._source():
            return src.tenants()
        return sorted(self._call("listing tenants", lambda: self.r.smembers(self._k_tenants())))

    def models(self, tenant: str) -> list[str]:
        if src := self._source():
            return src.models(tenant)
        return sorted(self._call("listing models", lambda: self.r.smembers(self._k_models(tenant))))

    def versions(self, tenant: str, model: str) -> list[str]:
        if src := self._source():
            return src.versions(tenant, model)
        vs = self._call("listing versions", lambda: self.r.smembers(self._k_versions(tenant, model)))
        return sorted(vs, key=version_sort_key)

    def manifest(self, tenant: str, model: str, version: str) -> ModelManifest:
        raw = self._call("reading a manifest", lambda: self.r.get(self._k_manifest(tenant, model, version)))
        if raw is None:
            if src := self._source():
                return src.manifest(tenant, model, version)
            raise ModelNotFound(f"model {model!r} version {version!r} not found")
        return ModelManifest.model_validate_json(raw)

    def policy(self, tenant: str, model: str) -> VersionPolicy:
        return self._versions_and_policy(tenant, model)[1]

    def _versions_and_policy(self, tenant: str, model: str) -> tuple[list[str], VersionPolicy]:
        """One round trip for the ready marker, the versions and the policy."""

        def fetch():
            p = self.r.pipeline(transaction=False)
            p.exists(self._k_ready())
            p.smembers(self._k_versions(tenant, model))
            p.get(self._k_policy(tenant, model))
            return p.execute()

        ready, vs, pol = self._call("resolving a model", fetch)
        if not ready:
            return self._fallback._versions_and_policy(tenant, model)
        policy = VersionPolicy.model_validate_json(pol) if pol else VersionPolicy()
        return sorted(vs, key=version_sort_key), policy

    # -- writes ---------------------------------------------------------------------------------------

    def _index_version_into(self, p, m: ModelManifest) -> None:
        p.sadd(self._k_tenants(), m.tenant)
        p.sadd(self._k_models(m.tenant), m.model)
        p.sadd(self._k_versions(m.tenant, m.model), m.version)
        p.set(self._k_manifest(m.tenant, m.model, m.version), m.model_dump_json())

    def index_version(self, manifest: ModelManifest) -> None:
        """Call after the manifest is written to storage (storage first: it is the truth)."""

        def run():
            p = self.r.pipeline(transaction=True)
            self._index_version_into(p, manifest)
            p.execute()

        self._call("indexing a version", run)

    def index_policy(self, tenant: str, model: str, policy: VersionPolicy) -> None:
        """Call after the policy is written to storage."""
        self._call("indexing a policy", lambda: self.r.set(self._k_policy(tenant, model), policy.model_dump_json()))

    def rebuild(self, progress: Callable[[ModelManifest], None] | None = None) -> RebuildReport:
        """Recreate the index from storage: write every manifest and policy, then drop index entries that
        storage no longer has, then mark the index ready. Readers never see a stored model go missing."""
        report = RebuildReport()
        keep: set[str] = {self._k_ready()}
        for t in self.repo.tenants():
            for mname in self.repo.models(t):
                versions = self.repo.versions(t, mname)
                if not versions:
                    continue
                manifests = [self.repo.manifest(t, mname, v) for v in versions]
                policy = self.repo.policy(t, mname)

                def write(manifests=manifests, policy=policy, t=t, mname=mname):
                    p = self.r.pipeline(transaction=True)
                    p.delete(self._k_versions(t, mname))
                    for m in manifests:
                        self._index_version_into(p, m)
                    if policy.kind == "latest" and not policy.version and not policy.weights:
                        p.delete(self._k_policy(t, mname))
                    else:
                        p.set(self._k_policy(t, mname), policy.model_dump_json())
                    p.execute()

                self._call("rebuilding the index", write)
                keep |= {self._k_tenants(), self._k_models(t), self._k_versions(t, mname), self._k_policy(t, mname)}
                keep |= {self._k_manifest(t, mname, m.version) for m in manifests}
                report.models += 1
                report.versions += len(manifests)
                report.tenants.add(t)
                for m in manifests:
                    if progress:
                        progress(m)
        report.pruned = self._prune(keep, report)
        self._call("marking the index ready", lambda: self.r.set(self._k_ready(), datetime.now(timezone.utc).isoformat()))
        return report

    def _prune(self, keep: set[str], report: RebuildReport) -> int:
        """Delete index keys and set members for what storage no longer holds."""

        def run() -> int:
            stale = [k for k in self.r.scan_iter(match=f"{self.prefix}*", count=1000) if k not in keep]
            p = self.r.pipeline(transaction=False)
            for k in stale:
                p.delete(k)
            live_tenants = sorted(report.tenants)
            for t in self.r.smembers(self._k_tenants()):
                if t not in report.tenants:
                    p.srem(self._k_tenants(), t)
            for t in live_tenants:
                for m in self.r.smembers(self._k_models(t)):
                    if self._k_versions(t, m) not in keep:
                        p.srem(self._k_models(t), m)
            p.execute()
            return len(stale)

        return self._call("pruning the index", run)


class RebuildReport:
    def __init__(self) -> None:
        self.tenants: set[str] = set()
        self.models = 0
        self.versions = 0
        self.pruned = 0

    def __str__(self) -> str:
        return (
            f"indexed {self.versions} version(s) of {self.models} model(s) for {len(self.tenants)} tenant(s); "
            f"removed {self.pruned} stale key(s)"
        )
