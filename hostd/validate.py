"""Validate a model file before it is published: the checks behind `mmhost upload` (an operator, with the
store's credentials) and behind the router's Uploads service (a tenant, with its API key).

Nothing is written anywhere until the model has passed every check: size limit, a format that cannot run
arbitrary code on load, a self-contained file (no ONNX external data), a successful load in the runtime that
will serve it (this package's, so a model that validates is one a hostd loads), a signature (read from the
file, or stated by the uploader for TorchScript), and one test inference on zeros.

`python -m hostd.validate` is the same check as a worker process: the router runs one per upload (it does not
import hostd: a tenant's model is loaded and run in a process of its own, with a timeout, without the router's
credentials, and a runtime that crashes on a crafted file takes only the worker down). Protocol: one JSON
object on stdin (`UploadRequest.to_json` plus "version"), one on stdout: {"manifest": {...}} or
{"refused": "why"}; exit 0 in both cases.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ground.manifest import DynamicBatching, ModelFormat, ModelManifest, TensorSpec, check_name
from hostd.runtimes.base import DeviceSpec, RuntimeLoadError, warmup_inputs
from hostd.runtimes.registry import detect_format, load_model, read_signature

DEFAULT_MAX_BYTES = 2 << 30
DEFAULT_MAX_BATCH_SIZE = 32
MODEL_FILE = {ModelFormat.ONNX: "model.onnx", ModelFormat.TORCHSCRIPT: "model.pt", ModelFormat.TORCH_EXPORT: "model.pt2"}
# manifest options an upload may carry in `config` (mmhost.model_config_file's output); others are refused
CONFIG_KEYS = frozenset({"format", "inputs", "outputs", "max_batch_size", "dynamic_batching", "instance_count",
                         "queue_policy", "description"})


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

    def to_json(self) -> dict:
        """The request as the worker reads it (`file` as a path string, tensors as dicts)."""
        return {
            "tenant": self.tenant, "model": self.model, "file": str(self.file), "version": self.version,
            "format": self.format.value if self.format else None,
            "inputs": [t.model_dump() for t in self.inputs], "outputs": [t.model_dump() for t in self.outputs],
            "max_batch_size": self.max_batch_size, "instance_count": self.instance_count,
            "max_queue_delay_us": self.max_queue_delay_us, "max_bytes": self.max_bytes,
            "uploaded_by": self.uploaded_by, "description": self.description, "config": self.config,
        }

    @classmethod
    def from_json(cls, d: dict) -> UploadRequest:
        """The inverse of to_json; ValueError (or pydantic's ValidationError, one) on a malformed request."""
        try:
            return cls(
                tenant=str(d["tenant"]), model=str(d["model"]), file=Path(d["file"]), version=d.get("version"),
                format=ModelFormat(d["format"]) if d.get("format") else None,
                inputs=[TensorSpec.model_validate(t) for t in d.get("inputs") or []],
                outputs=[TensorSpec.model_validate(t) for t in d.get("outputs") or []],
                max_batch_size=d.get("max_batch_size"), instance_count=int(d.get("instance_count") or 1),
                max_queue_delay_us=int(d.get("max_queue_delay_us") or 0),
                max_bytes=int(d.get("max_bytes") or DEFAULT_MAX_BYTES), uploaded_by=str(d.get("uploaded_by") or ""),
                description=str(d.get("description") or ""), config=dict(d.get("config") or {}),
            )
        except (KeyError, TypeError) as e:
            raise ValueError(f"malformed upload request: {type(e).__name__}: {e}") from None


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


def validate(req: UploadRequest, version: str = "0", device: DeviceSpec | None = None) -> ModelManifest:
    """Every check that needs no store. Returns the manifest to publish (files are filled in by publish).
    `device`: where the test load and inference run (default: the CPU, runtimes' own thread counts)."""
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
        loaded = load_model(req.file, manifest, device or DeviceSpec())
    except RuntimeLoadError as e:
        raise UploadRefused(f"{req.file.name} does not load as {fmt.value}: {e}") from None
    try:
        got = loaded.run(warmup_inputs(inputs), [t.name for t in outputs])
    except Exception as e:  # runtimes raise their own types for shape/dtype mismatches
        raise UploadRefused(f"test inference on zeros failed: {type(e).__name__}: {e}") from None
    finally:
        loaded.close()
    _check_outputs(outputs, got)
    return manifest


def _config_errors(config: dict) -> str | None:
    unknown = sorted(set(config) - CONFIG_KEYS)
    return f"unknown config option(s): {', '.join(unknown[:5])}" if unknown else None


def check(request: dict) -> dict:
    """The worker's answer to one request: {"manifest": ...} or {"refused": ...}."""
    try:
        req = UploadRequest.from_json(request)
        if (why := _config_errors(req.config)) is not None:
            raise UploadRefused(why)
        # one thread each: a worker beside a router's event loop must not take every core
        manifest = validate(req, str(request.get("version") or "0"), DeviceSpec(ort_intra_op_threads=1, torch_threads=1))
    except UploadRefused as e:
        return {"refused": str(e)}
    except (ValueError, TypeError) as e:  # a malformed request or config the manifest's own checks refused
        return {"refused": f"invalid upload: {str(e)[:500]}"}
    return {"manifest": json.loads(manifest.model_dump_json())}


def main() -> None:
    """Read one request on stdin, answer on stdout. Anything the runtimes print goes to stderr, so stdout
    carries the answer alone."""
    out = os.dup(1)
    os.dup2(2, 1)
    try:
        os.nice(10)  # the router's event loop goes first for a core (Linux; harmless elsewhere)
    except (AttributeError, OSError):
        pass
    answer = check(json.loads(sys.stdin.read()))
    with os.fdopen(out, "w") as f:
        f.write(json.dumps(answer))


if __name__ == "__main__":
    main()
