"""Validate a model file and publish it as a new version: the logic behind `mmhost upload`.

Nothing is written to the store until the model has passed every check: size limit, a format that cannot
run arbitrary code on load, a successful load in its runtime, a signature (read from the file, or stated by
the uploader for TorchScript), and one test inference on zeros.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ground.manifest import DATATYPES, DynamicBatching, ModelFormat, ModelManifest, TensorSpec, check_name
from storage_adapters.base import ProgressFn
from catalog.publish import publish_version
from catalog.repository import ModelRepository

DEFAULT_MAX_BYTES = 2 << 30
DEFAULT_MAX_BATCH_SIZE = 32
_log = logging.getLogger(__name__)
MODEL_FILE = {ModelFormat.ONNX: "model.onnx", ModelFormat.TORCHSCRIPT: "model.pt", ModelFormat.TORCH_EXPORT: "model.pt2"}


class UploadRefused(Exception):
    """The model failed validation, or the version cannot be written. Nothing was stored."""


@dataclass
class UploadRequest:
    tenant: str
    model: str
    file: Path
    version: str | None = None
    format: ModelFormat | None = None
    inputs: list[TensorSpec] = field(default_factory=list)
    outputs: list[TensorSpec] = field(default_factory=list)
    max_batch_size: int | None = None  # None: 32 when every tensor's first dimension is dynamic, else 0
    instance_count: int = 1
    max_queue_delay_us: int = 0
    max_bytes: int = DEFAULT_MAX_BYTES
    uploaded_by: str = ""
    description: str = ""
    config: dict = field(default_factory=dict)  # manifest options from --config (flags given explicitly win)


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


def next_version(repo: ModelRepository, tenant: str, model: str) -> str:
    """One past the highest integer version folder, complete or not: a half-written folder is never reused."""
    from ground.manifest import model_prefix

    nums = [int(v) for v in repo.storage.list_dirs(model_prefix(tenant, model)) if v.isdigit()]
    return str(max(nums, default=0) + 1)


def _zeros(spec: TensorSpec) -> np.ndarray:
    shape = [1 if d == -1 else d for d in spec.shape]
    if spec.datatype == "BYTES":
        return np.full(shape, b"", dtype=object)
    return np.zeros(shape, dtype=DATATYPES[spec.datatype])


def _check_outputs(spec: list[TensorSpec], got: dict[str, np.ndarray]) -> None:
    for t in spec:
        if t.name not in got:
            raise UploadRefused(f"test inference did not return output {t.name!r}")
        arr = got[t.name]
        if len(arr.shape) != len(t.shape) or any(d != -1 and d != a for d, a in zip(t.shape, arr.shape, strict=True)):
            raise UploadRefused(
                f"test inference returned {t.name!r} with shape {list(arr.shape)}, the signature says {t.shape}"
            )


def _external_data(path: Path) -> list[str]:
    """The external data files an ONNX model's tensors point to (empty for a self-contained model)."""
    import onnx
    from onnx.external_data_helper import uses_external_data

    model = onnx.load(str(path), load_external_data=False)
    graphs, files = [model.graph], []
    while graphs:
        g = graphs.pop()
        tensors = list(g.initializer)
        for node in g.node:
            for attr in node.attribute:
                tensors += [attr.t, *attr.tensors]
                graphs += [attr.g, *attr.graphs]
        for t in tensors:
            if uses_external_data(t):
                files += [e.value for e in t.external_data if e.key == "location"]
    return sorted(set(files))


def validate(req: UploadRequest, version: str = "0") -> ModelManifest:
    """Every check that needs no store. Returns the manifest to publish (files are filled in by publish)."""
    from hostd.runtimes.base import DeviceSpec, RuntimeLoadError
    from hostd.runtimes.registry import detect_format, load_model, read_signature

    try:
        check_name("tenant", req.tenant)
        check_name("model", req.model)
        check_name("version", version)
    except ValueError as e:
        raise UploadRefused(str(e)) from None
    if not req.file.is_file():
        raise UploadRefused(f"{req.file}: no such file")
    size = req.file.stat().st_size
    if size > req.max_bytes:
        raise UploadRefused(f"{req.file.name} is {size} bytes, over the limit of {req.max_bytes} bytes (--max-bytes)")
    try:
        fmt = detect_format(req.file)
    except RuntimeLoadError as e:
        raise UploadRefused(str(e)) from None
    cfg = req.config
    want = req.format or (ModelFormat(cfg["format"]) if cfg.get("format") else None)
    if want is not None and want is not fmt:
        source = "--format" if req.format is not None else "the config's format"
        raise UploadRefused(f"{req.file.name}: {source} is {want.value}, but the file is {fmt.value}")
    try:
        external = _external_data(req.file) if fmt is ModelFormat.ONNX else []
    except Exception as e:  # onnx raises protobuf's DecodeError and others for a damaged file
        raise UploadRefused(f"{req.file.name} does not load as {fmt.value}: {type(e).__name__}: {e}") from None
    if external:
        raise UploadRefused(
            f"{req.file.name} keeps its weights in external data files ({', '.join(external[:3])}), "
            "which an upload would not carry: save the model as one file "
            "(onnx.save_model(model, path, save_as_external_data=False)) and upload that"
        )
    try:
        sig = read_signature(req.file, fmt)
    except RuntimeLoadError as e:
        raise UploadRefused(f"{req.file.name} does not load as {fmt.value}: {e}") from None
    inputs = req.inputs or [TensorSpec.model_validate(t) for t in cfg.get("inputs") or []]
    outputs = req.outputs or [TensorSpec.model_validate(t) for t in cfg.get("outputs") or []]
    if sig is None and not (inputs and outputs):
        raise UploadRefused(
            f"{req.file.name}: a {fmt.value} file does not declare its signature; "
            "state it with --input name:DTYPE:dims and --output name:DTYPE:dims"
        )
    if sig is not None:
        inputs, outputs = inputs or sig[0], outputs or sig[1]
    batchable = all(t.shape and t.shape[0] == -1 for t in inputs + outputs)
    mbs = req.max_batch_size if req.max_batch_size is not None else cfg.get("max_batch_size")
    if mbs is None:
        mbs = DEFAULT_MAX_BATCH_SIZE if batchable else 0
    batching = dict(cfg.get("dynamic_batching") or {})
    if req.max_queue_delay_us:
        batching["max_queue_delay_us"] = req.max_queue_delay_us
    try:
        manifest = ModelManifest(
            tenant=req.tenant,
            model=req.model,
            version=version,
            format=fmt,
            model_file=MODEL_FILE[fmt],
            inputs=inputs,
            outputs=outputs,
            max_batch_size=mbs,
            dynamic_batching=DynamicBatching(**batching) if mbs > 0 else None,
            instance_count=req.instance_count if req.instance_count != 1 else cfg.get("instance_count", 1),
            queue_policy=cfg.get("queue_policy") or {},
            uploaded_by=req.uploaded_by,
            description=req.description or cfg.get("description", ""),
        )
    except ValueError as e:
        raise UploadRefused(f"invalid model configuration: {e}") from None
    try:
        loaded = load_model(req.file, manifest, DeviceSpec())
    except RuntimeLoadError as e:
        raise UploadRefused(f"{req.file.name} does not load as {fmt.value}: {e}") from None
    try:
        got = loaded.run({t.name: _zeros(t) for t in inputs}, [t.name for t in outputs])
    except Exception as e:  # runtimes raise their own types for shape/dtype mismatches
        raise UploadRefused(f"test inference on zeros failed: {type(e).__name__}: {e}") from None
    finally:
        loaded.close()
    _check_outputs(outputs, got)
    return manifest


def upload(
    repo: ModelRepository,
    req: UploadRequest,
    progress_for: Callable[[str, int], ProgressFn | None] | None = None,
) -> ModelManifest:
    """Validate, then publish (files first, manifest last). Returns the manifest as written."""
    version = req.version or next_version(repo, req.tenant, req.model)
    manifest = validate(req, version)
    if version in repo.versions(req.tenant, req.model):
        raise UploadRefused(f"{req.tenant}/{req.model} version {version} already exists; versions are immutable")
    return publish_version(repo, manifest, {manifest.model_file: req.file}, progress_for)
