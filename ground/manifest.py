"""The model manifest: what a stored model version is, written last so that a version exists only once complete.

Layout in any store (local folder or object storage):
    <root>/tenants/<tenant>/models/<model>/<version>/manifest.json
    <root>/tenants/<tenant>/models/<model>/<version>/<model file(s)>
    <root>/tenants/<tenant>/models/<model>/policy.json        (optional version policy)
"""

from __future__ import annotations

import re
from datetime import datetime
from enum import Enum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MANIFEST_NAME = "manifest.json"
POLICY_NAME = "policy.json"
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")

# v2 datatype names and the numpy dtype each maps to (BYTES is an object array of bytes).
DATATYPES: dict[str, str] = {
    "BOOL": "bool",
    "UINT8": "uint8",
    "UINT16": "uint16",
    "UINT32": "uint32",
    "UINT64": "uint64",
    "INT8": "int8",
    "INT16": "int16",
    "INT32": "int32",
    "INT64": "int64",
    "FP16": "float16",
    "FP32": "float32",
    "FP64": "float64",
    "BYTES": "object",
}


def check_name(kind: str, value: str) -> str:
    """Tenant, model and version names are path segments: keep them to a safe alphabet."""
    if not NAME_RE.match(value) or value in (".", ".."):
        raise ValueError(f"invalid {kind} name {value!r}: use letters, digits, '_', '-', '.' (max 128)")
    return value


class ModelFormat(str, Enum):
    ONNX = "onnx"
    TORCHSCRIPT = "torchscript"
    TORCH_EXPORT = "torch_export"

    @property
    def platform(self) -> str:
        """Triton platform string reported in ModelMetadata / ModelConfig."""
        return {"onnx": "onnxruntime_onnx", "torchscript": "pytorch_libtorch", "torch_export": "torch_export"}[
            self.value
        ]


class TensorSpec(BaseModel):
    """One input or output. `shape` is the full shape the model sees; -1 marks a dynamic dimension.
    When the model batches (max_batch_size > 0) the first dimension is the batch dimension."""

    name: str
    datatype: str
    shape: list[int]

    @field_validator("datatype")
    @classmethod
    def _known_dtype(cls, v: str) -> str:
        v = v.upper()
        if v not in DATATYPES:
            raise ValueError(f"unknown datatype {v!r}; known: {', '.join(DATATYPES)}")
        return v

    @field_validator("shape")
    @classmethod
    def _dims(cls, v: list[int]) -> list[int]:
        if any(d < -1 for d in v):
            raise ValueError(f"shape {v}: dimensions must be >= 0 or -1 (dynamic)")
        return v


class QueuePolicy(BaseModel):
    """Triton's ModelQueuePolicy: bound the per-model queue and how long a request may wait in it."""

    max_queue_size: int = Field(0, ge=0, description="0 = unbounded")
    default_timeout_us: int = Field(0, ge=0, description="0 = no queue timeout")
    timeout_action: Literal["reject", "delay"] = "reject"
    allow_timeout_override: bool = True


class DynamicBatching(BaseModel):
    """Dynamic batching. With max_queue_delay_us = 0 a batch runs as soon as an executor is free
    (batches grow only while executors are busy); a positive delay lets a batch wait to fill.
    Frozen: a manifest without the section shares one default (ModelManifest.batching)."""

    model_config = ConfigDict(frozen=True)

    enabled: bool = True
    max_queue_delay_us: int = Field(0, ge=0)
    preferred_batch_sizes: list[int] = Field(default_factory=list)
    priority_levels: int = Field(0, ge=0)
    default_priority_level: int = Field(0, ge=0)


_DEFAULT_BATCHING = DynamicBatching()


class FileEntry(BaseModel):
    path: str
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")

    @field_validator("path")
    @classmethod
    def _relative(cls, v: str) -> str:
        if v.startswith("/") or ".." in v.split("/") or not v:
            raise ValueError(f"file path {v!r} must be relative and stay inside the version folder")
        return v


class ModelManifest(BaseModel):
    schema_version: int = 1
    tenant: str
    model: str
    version: str
    format: ModelFormat
    model_file: str
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    max_batch_size: int | None = Field(
        None, ge=0, description="None = automatic (batch when every tensor has a dynamic first dimension); 0 = off"
    )
    dynamic_batching: DynamicBatching | None = None
    instance_count: int = Field(1, ge=1, le=64)
    queue_policy: QueuePolicy = Field(default_factory=QueuePolicy)
    files: list[FileEntry] = Field(default_factory=list)
    uploaded_by: str = ""
    uploaded_at: datetime | None = None
    description: str = ""

    @field_validator("tenant")
    @classmethod
    def _tenant(cls, v: str) -> str:
        return check_name("tenant", v)

    @field_validator("model")
    @classmethod
    def _model(cls, v: str) -> str:
        return check_name("model", v)

    @field_validator("version")
    @classmethod
    def _version(cls, v: str) -> str:
        return check_name("version", v)

    @model_validator(mode="after")
    def _consistent(self) -> ModelManifest:
        if not self.inputs or not self.outputs:
            raise ValueError("a model needs at least one input and one output")
        names = [t.name for t in self.inputs] + [t.name for t in self.outputs]
        if len(set(t.name for t in self.inputs)) != len(self.inputs):
            raise ValueError(f"duplicate input names in {names}")
        if self.max_batch_size:
            for t in self.inputs + self.outputs:
                if not t.shape or t.shape[0] != -1:
                    raise ValueError(
                        f"tensor {t.name!r}: a batching model (max_batch_size > 0) needs a dynamic first dimension"
                    )
        if self.files and self.model_file not in {f.path for f in self.files}:
            raise ValueError(f"model_file {self.model_file!r} is not among the manifest's files")
        return self

    @property
    def batchable(self) -> bool:
        """Every input and output has a dynamic first dimension, so requests can be stacked."""
        return all(t.shape and t.shape[0] == -1 for t in self.inputs + self.outputs)

    def resolved(self, default_max_batch_size: int) -> ModelManifest:
        """The manifest with max_batch_size decided: automatic means `default_max_batch_size` for a batchable
        model and 0 otherwise; dynamic batching switched off means 0."""
        mbs = self.max_batch_size
        if mbs is None:
            mbs = default_max_batch_size if self.batchable else 0
        if self.dynamic_batching is not None and not self.dynamic_batching.enabled:
            mbs = 0
        return self.model_copy(update={"max_batch_size": mbs})

    @property
    def batching(self) -> DynamicBatching:
        """The dynamic_batching section, or the defaults when there is none (one shared object: read on
        every request's path, never built per read)."""
        return self.dynamic_batching or _DEFAULT_BATCHING

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def key(self) -> tuple[str, str, str]:
        return (self.tenant, self.model, self.version)

    def file_entry(self, path: str) -> FileEntry:
        for f in self.files:
            if f.path == path:
                return f
        raise KeyError(path)


class VersionPolicy(BaseModel):
    """Which version a request without an explicit version gets.
    latest: the highest version (numeric order when all are integers, else lexical);
    pinned: always `version`; split: weighted traffic split between versions (canaries)."""

    kind: Literal["latest", "pinned", "split"] = "latest"
    version: str | None = None
    weights: dict[str, float] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _valid(self) -> VersionPolicy:
        if self.kind == "pinned" and not self.version:
            raise ValueError("a pinned policy needs a version")
        if self.kind == "split":
            if not self.weights or any(w < 0 for w in self.weights.values()) or sum(self.weights.values()) <= 0:
                raise ValueError("a split policy needs non-negative weights with a positive sum")
        return self


def version_sort_key(v: str) -> tuple[int, int | str]:
    return (0, int(v)) if v.isdigit() else (1, v)


def model_prefix(tenant: str, model: str) -> str:
    return f"tenants/{tenant}/models/{model}/"


def version_prefix(tenant: str, model: str, version: str) -> str:
    return f"tenants/{tenant}/models/{model}/{version}/"
