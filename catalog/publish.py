"""Write a model version into a store: files first, with size and sha256, then the manifest last, so a
version becomes visible only once complete. `mmhost upload --store` (an operator) and the router's Uploads
service (a tenant) validate the model (hostd/validate.py) and then call this."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from ground.hashing import sha256_file
from ground.manifest import FileEntry, ModelManifest, model_prefix
from storage_adapters.base import ProgressFn
from catalog.repository import ModelRepository

__all__ = ["VersionExists", "next_version", "publish_version", "sha256_file"]


class VersionExists(Exception):
    """The version already has a manifest: versions are immutable."""


def publish_version(
    repo: ModelRepository,
    manifest: ModelManifest,
    files: dict[str, Path],
    progress_for: Callable[[str, int], ProgressFn | None] | None = None,
    known: dict[str, tuple[int, str]] | None = None,
) -> ModelManifest:
    """`files` maps the path inside the version folder to a local file. Returns the manifest as written,
    with `files` filled in (size and sha256 of each) and `uploaded_at` set when it was not.

    `known` maps some of those paths to the (size, sha256) the caller already computed (the router hashes an
    upload as it arrives): those files are not read again here. A file whose size is no longer the known one
    changed since it was hashed: ValueError, nothing written.

    Versions are immutable: a version that already has a manifest is refused (VersionExists), nothing
    written. The check and the write are not atomic across writers: router/uploads.py takes one upload at a
    time per tenant on each router (UploadSlots), so a router never races itself on a tenant's model; two
    writers at the same moment on different routers (or a router and `mmhost upload --store`) can both pass
    the check, or both pick the same next_version number, and are not caught here (docs/storage.md: enable
    bucket versioning)."""
    if manifest.version in repo.versions(manifest.tenant, manifest.model):
        raise VersionExists(f"model {manifest.model!r} version {manifest.version!r} already exists; "
                            "versions are immutable")
    known = known or {}
    entries = []
    for rel, local in sorted(files.items()):
        size = local.stat().st_size
        if rel in known:
            known_size, digest = known[rel]
            if size != known_size:
                raise ValueError(f"{local}: {size} bytes, {known_size} when it was hashed: changed since")
        else:
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
