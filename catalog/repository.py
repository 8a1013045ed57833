"""The model repository layout over any Storage: tenants, models, versions, manifests and version policies.

A version exists only once its manifest is written (uploads write it last), so a half-finished upload is
never visible here.
"""

from __future__ import annotations

from collections.abc import Callable
import random

from pydantic import ValidationError

from ground.manifest import (
    MANIFEST_NAME,
    POLICY_NAME,
    ModelManifest,
    VersionPolicy,
    model_prefix,
    version_prefix,
    version_sort_key,
)
from ground.versions import VersionNotFound, resolve_version
from storage_adapters.base import ObjectNotFound, Storage, StorageError


class ModelNotFound(LookupError):
    """No such tenant/model/version. Deliberately the same for 'another tenant's model'."""


class ManifestInvalid(StorageError):
    """A manifest exists but cannot be parsed or does not validate."""


class ModelRepository:
    def __init__(self, storage: Storage) -> None:
        self.storage = storage

    @property
    def description(self) -> str:
        return self.storage.description

    def tenants(self) -> list[str]:
        return self.storage.list_dirs("tenants/")

    def models(self, tenant: str) -> list[str]:
        return self.storage.list_dirs(f"tenants/{tenant}/models/")

    def versions(self, tenant: str, model: str) -> list[str]:
        """Complete versions (manifest present), oldest first."""
        return self.versions_and_policy(tenant, model)[0]

    def versions_and_policy(self, tenant: str, model: str) -> tuple[list[str], VersionPolicy]:
        """One listing of the model's prefix gives its complete versions and whether it has a policy file,
        so a model without one costs a single request, not one per version plus a failed read."""
        prefix = model_prefix(tenant, model)
        out = []
        has_policy = False
        for obj in self.storage.list(prefix):
            rest = obj.key[len(prefix):].split("/")
            if len(rest) == 2 and rest[1] == MANIFEST_NAME:
                out.append(rest[0])
            elif rest == [POLICY_NAME]:
                has_policy = True
        versions = sorted(out, key=version_sort_key)
        return versions, (self.policy(tenant, model) if has_policy and versions else VersionPolicy())

    def manifest(self, tenant: str, model: str, version: str) -> ModelManifest:
        key = version_prefix(tenant, model, version) + MANIFEST_NAME
        try:
            raw = self.storage.read_bytes(key)
        except ObjectNotFound:
            raise ModelNotFound(f"model {model!r} version {version!r} not found") from None
        try:
            m = ModelManifest.model_validate_json(raw)
        except (ValidationError, ValueError) as e:
            raise ManifestInvalid(f"{self.description}: manifest {key!r} is invalid: {e}") from e
        if m.key() != (tenant, model, version):
            raise ManifestInvalid(f"{self.description}: manifest {key!r} names {m.key()}, not its own location")
        return m

    def policy(self, tenant: str, model: str) -> VersionPolicy:
        try:
            raw = self.storage.read_bytes(model_prefix(tenant, model) + POLICY_NAME)
        except ObjectNotFound:
            return VersionPolicy()
        try:
            return VersionPolicy.model_validate_json(raw)
        except (ValidationError, ValueError) as e:
            raise ManifestInvalid(f"{self.description}: version policy of {tenant}/{model} is invalid: "
                                  f"{str(e)[:200]}") from e

    def set_policy(self, tenant: str, model: str, policy: VersionPolicy) -> None:
        self.storage.put_bytes(model_prefix(tenant, model) + POLICY_NAME, policy.model_dump_json().encode())

    def resolve(self, tenant: str, model: str, version: str | None = None, u: float | None = None) -> ModelManifest:
        return resolve_manifest(self.versions_and_policy, self.manifest, tenant, model, version, u)

    def all_manifests(self) -> list[ModelManifest]:
        out = []
        for t in self.tenants():
            for m in self.models(t):
                for v in self.versions(t, m):
                    out.append(self.manifest(t, m, v))
        return out

    def write_manifest(self, manifest: ModelManifest) -> None:
        key = version_prefix(manifest.tenant, manifest.model, manifest.version) + MANIFEST_NAME
        self.storage.put_bytes(key, manifest.model_dump_json(indent=2).encode())

    @staticmethod
    def file_key(manifest: ModelManifest, path: str) -> str:
        return version_prefix(manifest.tenant, manifest.model, manifest.version) + path


def resolve_manifest(
    versions_and_policy: Callable[[str, str], tuple[list[str], VersionPolicy]],
    manifest: Callable[[str, str, str], ModelManifest],
    tenant: str,
    model: str,
    version: str | None = None,
    u: float | None = None,
) -> ModelManifest:
    """The manifest a request for (tenant, model[, version]) gets, from any catalog; `u` is the uniform
    draw for weighted splits (random when not given)."""
    versions, policy = versions_and_policy(tenant, model)
    if not versions:
        raise ModelNotFound(f"model {model!r} not found")
    try:
        v = resolve_version(versions, policy, version, random.random() if u is None else u)
    except VersionNotFound as e:
        raise ModelNotFound(f"model {model!r}: {e}") from None
    return manifest(tenant, model, v)
