"""Write a model version into a store: files first, with size and sha256, then the manifest last, so a
version becomes visible only once complete. `mmhost upload --store` (an operator) and the router's Uploads
service (a tenant) validate the model (hostd/validate.py) and then call this."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from ground.manifest import FileEntry, ModelManifest, model_prefix
from storage_adapters.base import ProgressFn
from catalog.repository import ModelRepository

_CHUNK = 1 << 20


class VersionExists(Exception):
    """The version already has a manifest: versions are immutable."""


def sha256_file(path: Path, progress: ProgressFn | None = None) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            if progress:
                progress(len(chunk))
    return h.hexdigest()


def publish_version(
    repo: ModelRepository,
    manifest: ModelManifest,
    files: dict[str, Path],
    progress_for: Callable[[str, int], ProgressFn | None] | None = None,
) -> ModelManifest:
    """`files` maps the path inside the version folder to a local file. Returns the manifest as written,
    with `files` filled in (size and sha256 of each) and `uploaded_at` set when it was not."""
    entries = []
    for rel, local in sorted(files.items()):
        size = local.stat().st_size
        digest = sha256_file(local)
        key = repo.file_key(manifest, rel)
        cb = progress_for(rel, size) if progress_for else None
        repo.storage.upload_file(local, key, progress=cb)
        entries.append(FileEntry(path=rel, size=size, sha256=digest))
    final = manifest.model_copy(
        update={"files": entries, "uploaded_at": manifest.uploaded_at or datetime.now(timezone.utc)}
    )
    final = ModelManifest.model_validate(final.model_dump())  # re-check model_file is among the files
    repo.write_manifest(final)
    return final


def next_version(repo: ModelRepository, tenant: str, model: str) -> str:
    """One past the highest integer version folder, complete or not: a half-written folder is never reused.
    Lists the tenant's own model prefix only: another tenant's versions never show in the number."""
    nums = [int(v) for v in repo.storage.list_dirs(model_prefix(tenant, model)) if v.isdigit()]
    return str(max(nums, default=0) + 1)


def publish_new_version(
    repo: ModelRepository,
    manifest: ModelManifest,
    files: dict[str, Path],
    progress_for: Callable[[str, int], ProgressFn | None] | None = None,
) -> ModelManifest:
    """publish_version, refusing (VersionExists) a version that already has a manifest. The check and the
    write are not atomic across writers: callers that may race on one model serialize (router/uploads.py
    holds a lock per model; two writers on different routers at once are caught only by the version folder
    numbering, see docs/storage.md)."""
    if manifest.version in repo.versions(manifest.tenant, manifest.model):
        raise VersionExists(f"model {manifest.model!r} version {manifest.version!r} already exists; "
                            "versions are immutable")
    return publish_version(repo, manifest, files, progress_for)
