"""Bring a Triton model repository over: `<model>/config.pbtxt` + `<model>/<version>/model.onnx | model.pt`.

Each model's config is mapped by mmhost.triton_config; each version folder Triton would serve (its
version_policy) goes through the normal upload path (mmhost.upload: every check, then publish), keeping
Triton's version numbers. A model that is refused never stops the others; the result says, per model,
what was imported and why anything was not. A version already stored with the same bytes counts as
imported, so a second run after fixing one model finishes the job.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from catalog.repository import ModelRepository
from ground.hashing import sha256_file
from ground.manifest import ModelFormat, ModelManifest, check_name
from mmhost.triton_config import DEFAULT_FILENAME, TritonConfigError, TritonModelConfig, parse_pbtxt
from mmhost.upload import DEFAULT_MAX_BYTES, UploadRefused, UploadRequest, upload
from storage_adapters.base import ProgressFn, StorageError, StorageUnavailable

CONFIG_NAME = "config.pbtxt"


@dataclass
class ModelImport:
    """What happened to one model of the repository."""

    model: str
    imported: list[str] = field(default_factory=list)  # versions now in the store (new or already there)
    already_stored: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # version folders outside the version_policy
    refused: str | None = None  # the whole model
    version_errors: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    manifests: list[ModelManifest] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.refused is None and not self.version_errors


def model_dirs(repo_dir: Path) -> list[Path]:
    """The model folders of a repository: every sub-folder, except hidden ones."""
    return sorted(p for p in repo_dir.iterdir() if p.is_dir() and not p.name.startswith("."))


def _read_config(model_dir: Path) -> TritonModelConfig:
    path = model_dir / CONFIG_NAME
    if not path.is_file():
        raise TritonConfigError(f"no {CONFIG_NAME} in {model_dir.name}/")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise TritonConfigError(f"{model_dir.name}/{CONFIG_NAME}: {e}") from None
    return parse_pbtxt(text, f"{model_dir.name}/{CONFIG_NAME}")


def select_versions(found: list[int], policy: tuple[str, list[int]]) -> list[int]:
    """The versions Triton would serve: the latest n (default 1), all, or the listed ones that exist."""
    kind, arg = policy
    if kind == "all":
        return sorted(found)
    if kind == "specific":
        return sorted(v for v in found if v in set(arg))
    return sorted(found)[-arg[0]:] if found else []


def _model_file(version_dir: Path, cfg: TritonModelConfig) -> Path:
    if cfg.model_filename:
        return version_dir / cfg.model_filename
    if cfg.format is not None:
        return version_dir / DEFAULT_FILENAME[cfg.format]
    for name in DEFAULT_FILENAME.values():  # no platform or backend stated: whichever file is there
        if (version_dir / name).is_file():
            return version_dir / name
    return version_dir / DEFAULT_FILENAME[ModelFormat.ONNX]


def _same_bytes(repo: ModelRepository, tenant: str, model: str, version: str, file: Path) -> bool:
    m = repo.manifest(tenant, model, version)
    return m.file_entry(m.model_file).sha256 == sha256_file(file)


def import_model(
    repo: ModelRepository,
    model_dir: Path,
    tenant: str,
    *,
    uploaded_by: str = "",
    max_bytes: int = DEFAULT_MAX_BYTES,
    progress_for: Callable[[str, int], ProgressFn | None] | None = None,
    step: Callable[[str], None] | None = None,
) -> ModelImport:
    """Import one model folder. StorageUnavailable propagates (the store is down: stop the whole import)."""
    result = ModelImport(model=model_dir.name)
    say = step or (lambda _m: None)
    try:
        check_name("model", model_dir.name)
        cfg = _read_config(model_dir)
    except (ValueError, TritonConfigError) as e:
        result.refused = str(e)
        return result
    result.warnings += cfg.warnings
    if cfg.name and cfg.name != model_dir.name:
        result.refused = f"config name {cfg.name!r} differs from the folder name {model_dir.name!r} (Triton refuses it too)"
        return result
    found = sorted(int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit())
    others = sorted(p.name for p in model_dir.iterdir() if p.is_dir() and not p.name.isdigit())
    if others:
        result.warnings.append(f"folders that are not versions ignored: {', '.join(others)}")
    wanted = select_versions(found, cfg.version_policy)
    result.skipped = [str(v) for v in found if v not in wanted]
    if not wanted:
        result.refused = "no version folder to import" + (f" (version_policy selects none of {found})" if found else "")
        return result
    options = cfg.options.manifest_options()
    stored = set(repo.versions(tenant, model_dir.name))
    for v in wanted:
        version = str(v)
        file = _model_file(model_dir / version, cfg)
        if not file.is_file():
            result.version_errors[version] = f"no {file.name} in {model_dir.name}/{version}/"
            continue
        try:
            if version in stored:
                if _same_bytes(repo, tenant, model_dir.name, version, file):
                    result.imported.append(version)
                    result.already_stored.append(version)
                else:
                    result.version_errors[version] = "already stored with different bytes; versions are immutable"
                continue
            say(f"checking {model_dir.name} version {version}")
            req = UploadRequest(
                tenant=tenant, model=model_dir.name, file=file, version=version, max_bytes=max_bytes,
                uploaded_by=uploaded_by, description=f"imported from Triton repository {model_dir.parent.name}",
                config=options,
            )
            result.manifests.append(upload(repo, req, progress_for))
            result.imported.append(version)
        except StorageUnavailable:
            raise
        except (UploadRefused, StorageError) as e:
            result.version_errors[version] = str(e)
        except Exception as e:  # a check that crashed on an odd file must not stop the other models
            result.version_errors[version] = f"{type(e).__name__}: {e}"
    return result


def import_repository(
    repo: ModelRepository,
    repo_dir: Path,
    tenant: str,
    *,
    uploaded_by: str = "",
    max_bytes: int = DEFAULT_MAX_BYTES,
    progress_for: Callable[[str, int], ProgressFn | None] | None = None,
    step: Callable[[str], None] | None = None,
) -> list[ModelImport]:
    """Import every model folder of a Triton repository; one result per model, refused ones included."""
    return [
        import_model(repo, d, tenant, uploaded_by=uploaded_by, max_bytes=max_bytes, progress_for=progress_for, step=step)
        for d in model_dirs(repo_dir)
    ]
