"""Triton's config.pbtxt (protobuf text format, model_config.proto) mapped onto mmhost's manifest options.

    Triton                                       mmhost manifest
    platform onnxruntime_onnx / backend onnxruntime   format onnx (checked against the file)
    platform pytorch_libtorch / backend pytorch       format torchscript (checked against the file)
    max_batch_size                               max_batch_size
    input / output {name, data_type, dims}       inputs / outputs {name, datatype, shape}; with max_batch_size > 0
                                                 Triton's dims leave out the batch dimension: shape = [-1] + dims
    dynamic_batching {}                          dynamic_batching (absent, with max_batch_size > 0: enabled false,
                                                 as Triton then batches only what clients send)
      max_queue_delay_microseconds               dynamic_batching.max_queue_delay_us
      preferred_batch_size                       dynamic_batching.preferred_batch_sizes
      priority_levels, default_priority_level    the same
      default_queue_policy {timeout_action, default_timeout_microseconds, allow_timeout_override, max_queue_size}
                                                 queue_policy {timeout_action, default_timeout_us, ...}
                                                 (absent: mmhost's queue policy defaults)
    instance_group [{count}]                     instance_count = the sum of the counts (kind, gpus: mmhost places)
    version_policy                               which version folders are imported (default: the latest one)
    default_model_filename                       the file read from each version folder

Refused by name (the model is not imported): ensembles, backends other than onnxruntime and pytorch,
sequence batching, decoupled models, per-priority queue policies, reshape / shape tensors / ragged batching /
optional inputs, BF16 tensors, repository agents. Ignored with a warning: model_warmup (every upload already
runs a test inference, and hostd loads on demand), optimization, response_cache, parameters and the other
settings listed in IGNORED. Anything else unknown is a typo and an error naming its full path.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field

from google.protobuf import text_format
from google.protobuf.descriptor import Descriptor
from pydantic import ValidationError

from ground.manifest import ModelFormat
from mmhost.model_config_file import ModelOptions, explain
from protos import model_config_pb2 as mc

PLATFORMS = {"onnxruntime_onnx": ModelFormat.ONNX, "pytorch_libtorch": ModelFormat.TORCHSCRIPT}
BACKENDS = {"onnxruntime": ModelFormat.ONNX, "pytorch": ModelFormat.TORCHSCRIPT}
DEFAULT_FILENAME = {ModelFormat.ONNX: "model.onnx", ModelFormat.TORCHSCRIPT: "model.pt"}

# Triton fields (not in our model_config.proto) whose presence means the model cannot be served as Triton would.
REFUSED: dict[str, str] = {
    "ensemble_scheduling": "ensembles are not supported: import the member models and chain them in the client",
    "sequence_batching": "sequence batching (stateful models with correlation ids) is not supported",
    "model_transaction_policy": "decoupled models (model_transaction_policy) are not supported",
    "batch_input": "batch inputs (ragged batching) are not supported",
    "batch_output": "batch outputs (ragged batching) are not supported",
    "model_repository_agents": "repository agents (checksum, decryption) are not supported",
    "runtime": "a custom backend runtime is not supported",
    "input.reshape": "reshape is not supported: state the shape the model itself takes",
    "output.reshape": "reshape is not supported: state the shape the model itself takes",
    "input.is_shape_tensor": "shape tensors are not supported",
    "output.is_shape_tensor": "shape tensors are not supported",
    "input.allow_ragged_batch": "ragged batching is not supported",
    "input.is_non_linear_format_io": "non-linear I/O formats (TensorRT) are not supported",
    "output.is_non_linear_format_io": "non-linear I/O formats (TensorRT) are not supported",
    "instance_group.passive": "passive instances are not supported",
}
# Triton fields that do not change what a model computes: ignored, with a warning.
IGNORED: dict[str, str] = {
    "model_warmup": "ignored: every upload runs a test inference on zeros, and hostd loads models on demand",
    "optimization": "ignored: backend accelerator and CUDA graph settings do not carry over",
    "response_cache": "ignored: mmhost has no response cache",
    "cc_model_filenames": "ignored: per-GPU model files are TensorRT's",
    "metric_tags": "ignored: mmhost exports its own metrics",
    "model_metrics": "ignored: mmhost exports its own metrics",
    "model_operations": "ignored",
    "input.format": "ignored: the tensor's layout is informational",
    "output.label_filename": "ignored: the classification extension is not served",
    "instance_group.rate_limiter": "ignored: mmhost admits requests with its own queue policy",
    "instance_group.secondary_devices": "ignored: mmhost places instances itself",
    "instance_group.profile": "ignored: TensorRT profiles",
    "instance_group.host_policy": "ignored: mmhost places instances itself",
}
_DTYPE_PREFIX = "TYPE_"


class TritonConfigError(ValueError):
    """The config cannot be imported: a syntax error, an unknown field, or a feature mmhost refuses.
    `refused` is True for a feature refused by name (the config itself is valid Triton)."""

    def __init__(self, message: str, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


@dataclass
class TritonModelConfig:
    name: str
    format: ModelFormat | None
    options: ModelOptions
    model_filename: str | None  # default_model_filename, if set
    version_policy: tuple[str, list[int]]  # ("latest", [n]) | ("all", []) | ("specific", [v, ...])
    warnings: list[str] = field(default_factory=list)


def _split_unknown(text: str, desc: Descriptor) -> tuple[str, list[tuple[str, list[str]]]]:
    """Walk the text's tokens against `desc` at every depth. Returns the text without the fields `desc` does not
    know (each token on its original line, so parse errors keep their line numbers) and, for each such field,
    its dotted path and the names known at its level. Repeated and map fields are walked like single messages.
    (protobuf's own allow_unknown_field cannot skip Triton's `model_warmup [ {...} ]` lists.)"""
    tok = text_format.Tokenizer(text.splitlines())
    out: list[tuple[int, str]] = []
    found: list[tuple[str, list[str]]] = []

    def take() -> str:
        t = tok.token
        out.append((getattr(tok, "_line", 0), t))
        tok.NextToken()
        return t

    def walk(d: Descriptor | None, prefix: str, end: str | None) -> None:
        while not tok.AtEnd():
            if end is not None and tok.token == end:
                take()
                return
            start = len(out)
            name = take()
            if name == "[":  # an extension or Any type URL: not part of Triton's config
                while not tok.AtEnd() and take() != "]":
                    pass
                name = "(extension)"
            f = d.fields_by_name.get(name) if d is not None else None
            if tok.token == ":":
                take()
            value(f.message_type if f is not None else None, prefix + name + ".")
            if tok.token in (",", ";"):
                take()
            if d is not None and f is None:
                found.append((prefix + name, sorted(d.fields_by_name)))
                del out[start:]

    def value(sub: Descriptor | None, prefix: str) -> None:
        first = take()
        if first == "[":
            while not tok.AtEnd() and tok.token != "]":
                value(sub, prefix)
                if tok.token == ",":
                    take()
            if not tok.AtEnd():
                take()
        elif first in ("{", "<"):
            walk(sub, prefix, "}" if first == "{" else ">")
        else:
            while first[:1] in ("'", '"') and tok.token[:1] in ("'", '"'):  # adjacent strings concatenate
                take()

    walk(desc, "", None)
    lines: dict[int, list[str]] = {}
    for line, t in out:
        lines.setdefault(line, []).append(t)
    kept = "\n".join(" ".join(lines.get(i, [])) for i in range(max(lines, default=0) + 1))
    return kept, found


def _tensor(kind: str, t, batching: bool, source: str) -> dict:
    dtype = mc.DataType.Name(t.data_type)
    if t.data_type == mc.TYPE_INVALID:
        raise TritonConfigError(f"{source}: {kind} {t.name!r} has no data_type")
    if t.data_type == mc.TYPE_BF16:
        raise TritonConfigError(f"{source}: {kind} {t.name!r}: BF16 tensors are not supported", refused=True)
    datatype = "BYTES" if t.data_type == mc.TYPE_STRING else dtype[len(_DTYPE_PREFIX):]
    dims = [int(d) for d in t.dims]
    return {"name": t.name, "datatype": datatype, "shape": [-1, *dims] if batching else dims}


def _format(cfg: mc.ModelConfig, source: str) -> ModelFormat | None:
    if cfg.platform == "ensemble":
        raise TritonConfigError(f"{source}: platform 'ensemble': ensembles are not supported: import the member models "
                                "and chain them in the client", refused=True)
    if cfg.backend and cfg.backend not in BACKENDS:
        raise TritonConfigError(f"{source}: backend {cfg.backend!r} is not supported (supported: onnxruntime, pytorch)", refused=True)
    if cfg.platform and cfg.platform not in PLATFORMS:
        raise TritonConfigError(
            f"{source}: platform {cfg.platform!r} is not supported (supported: onnxruntime_onnx, pytorch_libtorch)", refused=True
        )
    by_backend, by_platform = BACKENDS.get(cfg.backend), PLATFORMS.get(cfg.platform)
    if by_backend and by_platform and by_backend is not by_platform:
        raise TritonConfigError(f"{source}: backend {cfg.backend!r} and platform {cfg.platform!r} disagree")
    return by_backend or by_platform


def _queue_policy(q: mc.ModelQueuePolicy) -> dict:
    return {
        "max_queue_size": q.max_queue_size,
        "default_timeout_us": q.default_timeout_microseconds,
        "timeout_action": mc.ModelQueuePolicy.TimeoutAction.Name(q.timeout_action).lower(),
        "allow_timeout_override": q.allow_timeout_override,
    }


def parse_pbtxt(text: str, source: str = "config.pbtxt") -> TritonModelConfig:
    """Parse and map one config.pbtxt. TritonConfigError names the field and the reason."""
    try:
        kept, unknown = _split_unknown(text, mc.ModelConfig.DESCRIPTOR)
    except text_format.ParseError as e:
        raise TritonConfigError(f"{source}: not a valid Triton config: {e}") from None
    warnings: list[str] = []
    for path, known_here in unknown:
        if path in REFUSED:
            raise TritonConfigError(f"{source}: {path}: {REFUSED[path]}", refused=True)
        if path in IGNORED:
            warnings.append(f"{path} {IGNORED[path]}")
            continue
        parent, _, leaf = path.rpartition(".")
        siblings = known_here + [p.rpartition(".")[2] for p in (*REFUSED, *IGNORED) if p.rpartition(".")[0] == parent]
        close = difflib.get_close_matches(leaf, siblings, n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        raise TritonConfigError(f"{source}: unknown field {path}{hint}")
    cfg = mc.ModelConfig()
    try:
        text_format.Parse(kept, cfg)
    except text_format.ParseError as e:
        raise TritonConfigError(f"{source}: not a valid Triton config: {e}") from None

    fmt = _format(cfg, source)
    if cfg.max_batch_size < 0:
        raise TritonConfigError(f"{source}: max_batch_size {cfg.max_batch_size} is negative")
    batching = cfg.max_batch_size > 0
    opts: dict = {"max_batch_size": cfg.max_batch_size}
    if cfg.HasField("dynamic_batching"):
        db = cfg.dynamic_batching
        if db.priority_queue_policy:
            raise TritonConfigError(
                f"{source}: dynamic_batching.priority_queue_policy: per-priority queue policies are not supported "
                "(mmhost applies one queue policy per model)", refused=True)
        if not batching:
            warnings.append("dynamic_batching ignored: max_batch_size is 0, so requests are not batched")
        if db.preserve_ordering:
            warnings.append("dynamic_batching.preserve_ordering ignored: each request gets its own response")
        opts["dynamic_batching"] = {
            "max_queue_delay_us": db.max_queue_delay_microseconds,
            "preferred_batch_sizes": list(db.preferred_batch_size),
            "priority_levels": db.priority_levels,
            "default_priority_level": db.default_priority_level,
        }
        if db.HasField("default_queue_policy"):
            opts["queue_policy"] = _queue_policy(db.default_queue_policy)
    elif batching:
        opts["dynamic_batching"] = {"enabled": False}
        warnings.append("no dynamic_batching: requests run as clients send them, as in Triton")
    if cfg.instance_group:
        opts["instance_count"] = sum(g.count or 1 for g in cfg.instance_group)
        if any(g.gpus or g.kind not in (mc.ModelInstanceGroup.KIND_AUTO,) for g in cfg.instance_group):
            warnings.append("instance_group kind/gpus ignored: mmhost places instances itself (counts are summed)")
    for t in cfg.input:
        if t.optional:
            raise TritonConfigError(f"{source}: input {t.name!r}: optional inputs are not supported", refused=True)
    if cfg.input:
        opts["inputs"] = [_tensor("input", t, batching, source) for t in cfg.input]
    if cfg.output:
        opts["outputs"] = [_tensor("output", t, batching, source) for t in cfg.output]
    if fmt is not None:
        opts["format"] = fmt
    if cfg.parameters:
        warnings.append(f"parameters ignored: {', '.join(sorted(cfg.parameters))}")
    try:
        options = ModelOptions.model_validate(opts)
    except ValidationError as e:
        raise TritonConfigError(f"{source}: {explain(e)}") from None

    vp = cfg.version_policy
    which = vp.WhichOneof("policy_choice")
    if which == "all":
        policy: tuple[str, list[int]] = ("all", [])
    elif which == "specific":
        policy = ("specific", [int(v) for v in vp.specific.versions])
    else:
        policy = ("latest", [(vp.latest.num_versions or 1) if which else 1])
    return TritonModelConfig(
        name=cfg.name,
        format=fmt,
        options=options,
        model_filename=cfg.default_model_filename or None,
        version_policy=policy,
        warnings=warnings,
    )
