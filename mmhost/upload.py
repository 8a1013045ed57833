"""Validate a model file and publish it as a new version: the logic behind `mmhost upload --store` (an
operator, with the store's credentials). The checks themselves are hostd.validate's (shared with the router's
tenant uploads, router/uploads.py); publishing is catalog.publish's. Nothing is written to the store until the
model has passed every check.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from ground.manifest import ModelManifest, TensorSpec
from hostd.validate import (DEFAULT_MAX_BATCH_SIZE, DEFAULT_MAX_BYTES, MODEL_FILE, UploadRefused, UploadRequest,
                            validate)
from storage_adapters.base import ProgressFn
from catalog.publish import VersionExists, next_version, publish_version
from catalog.repository import ModelRepository

__all__ = ["DEFAULT_MAX_BATCH_SIZE", "DEFAULT_MAX_BYTES", "MODEL_FILE", "UploadRefused", "UploadRequest", "next_version",
           "parse_tensor_spec", "read_config", "upload", "validate"]
_log = logging.getLogger(__name__)


def read_config(path: Path, warn: Callable[[str], None] | None = None) -> dict:
    """Manifest options from a YAML, JSON or Triton config.pbtxt file, validated at every level
    (mmhost.model_config_file), e.g.
        max_batch_size: 16
        dynamic_batching: {max_queue_delay_us: 2000, preferred_batch_sizes: [8, 16], priority_levels: 2}
        queue_policy: {max_queue_size: 64, default_timeout_us: 500000, timeout_action: reject}
        instance_count: 2
    Triton features that are ignored are passed to `warn` (default: the log)."""
    from mmhost.model_config_file import ConfigFileError, load_options

    try:
        options = load_options(path, warn or _log.warning)
    except ConfigFileError as e:
        raise UploadRefused(f"--config {e}") from None
    return options.manifest_options()


def parse_tensor_spec(text: str) -> TensorSpec:
    """'name:DTYPE:d1,d2' (dims may be -1 for dynamic), e.g. 'INPUT__0:FP32:-1,16'."""
    parts = text.split(":")
    if len(parts) != 3 or not parts[0]:
        raise ValueError(f"tensor spec {text!r}: expected name:DTYPE:d1,d2 (e.g. INPUT__0:FP32:-1,16)")
    name, dtype, dims = parts
    try:
        shape = [int(d) for d in dims.split(",")] if dims.strip() else []
    except ValueError:
        raise ValueError(f"tensor spec {text!r}: dimensions must be integers (-1 for dynamic)") from None
    return TensorSpec(name=name, datatype=dtype, shape=shape)


def upload(
    repo: ModelRepository,
    req: UploadRequest,
    progress_for: Callable[[str, int], ProgressFn | None] | None = None,
) -> ModelManifest:
    """Validate, then publish (files first, manifest last). Returns the manifest as written."""
    version = req.version or next_version(repo, req.tenant, req.model)
    manifest = validate(req, version)
    try:
        return publish_version(repo, manifest, {manifest.model_file: req.file}, progress_for)
    except VersionExists as e:
        raise UploadRefused(str(e)) from None
