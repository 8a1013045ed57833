"""The --config file of `mmhost upload`: manifest options in YAML, JSON or Triton's config.pbtxt.

Every level is validated strictly: an unknown key anywhere is an error naming its full path
(`queue_policy.max_queue_sise`), never a silent default. Triton's own field names are accepted as aliases,
so a Triton user's options read as written:

    mmhost name                         also accepted (Triton)
    dynamic_batching.max_queue_delay_us   max_queue_delay_microseconds
    dynamic_batching.preferred_batch_sizes  preferred_batch_size
    queue_policy                        default_queue_policy (top level, or inside dynamic_batching as in Triton)
    queue_policy.default_timeout_us     default_timeout_microseconds
    queue_policy.timeout_action         REJECT / DELAY (any case)
    instance_count                      instance_group: [{count: 2}, ...] (counts are summed)

A Triton config.pbtxt (by extension, or by content) is read by mmhost.triton_config.
"""

from __future__ import annotations

import difflib
import json
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ground.manifest import ModelFormat, TensorSpec

_STRICT = ConfigDict(extra="forbid")
PBTXT_SUFFIXES = (".pbtxt", ".prototxt")
# Top-level keys that only a Triton config has: a YAML-parsable file carrying them is a config.pbtxt.
_TRITON_ONLY_KEYS = {"name", "platform", "backend", "input", "output", "default_model_filename", "version_policy"}
_PBTXT_BLOCK = re.compile(r"^\s*[A-Za-z_]\w*\s*[{\[<]", re.MULTILINE)  # `input [` / `dynamic_batching {`


class ConfigFileError(ValueError):
    """The config file cannot be read, or names an option that does not exist or has a bad value."""


def _alias(*names: str) -> Any:
    return Field(None, validation_alias=AliasChoices(*names))


class QueuePolicyOptions(BaseModel):
    model_config = _STRICT

    max_queue_size: int | None = None
    default_timeout_us: int | None = _alias("default_timeout_us", "default_timeout_microseconds")
    timeout_action: Literal["reject", "delay"] | None = None
    allow_timeout_override: bool | None = None

    @field_validator("timeout_action", mode="before")
    @classmethod
    def _lower(cls, v: Any) -> Any:
        return v.lower() if isinstance(v, str) else v


class DynamicBatchingOptions(BaseModel):
    model_config = _STRICT

    enabled: bool | None = None
    max_queue_delay_us: int | None = _alias("max_queue_delay_us", "max_queue_delay_microseconds")
    preferred_batch_sizes: list[int] | None = _alias("preferred_batch_sizes", "preferred_batch_size")
    priority_levels: int | None = None
    default_priority_level: int | None = None
    default_queue_policy: QueuePolicyOptions | None = None  # Triton keeps the queue policy here


class InstanceGroupOptions(BaseModel):
    """One of Triton's instance groups. Only the count matters: mmhost places instances itself."""

    model_config = _STRICT

    count: int = Field(1, ge=1)
    name: str | None = None
    kind: str | None = None
    gpus: list[int] | None = None


class StrictTensorSpec(TensorSpec):
    model_config = _STRICT


class ModelOptions(BaseModel):
    """What a config file may set. `manifest_options()` gives the dict `UploadRequest.config` takes."""

    model_config = _STRICT

    max_batch_size: int | None = None
    dynamic_batching: DynamicBatchingOptions | None = None
    queue_policy: QueuePolicyOptions | None = _alias("queue_policy", "default_queue_policy")
    instance_count: int | None = None
    instance_group: list[InstanceGroupOptions] | None = None
    description: str | None = None
    format: ModelFormat | None = None
    inputs: list[StrictTensorSpec] | None = None
    outputs: list[StrictTensorSpec] | None = None

    @model_validator(mode="after")
    def _triton_places(self) -> ModelOptions:
        db = self.dynamic_batching
        if db is not None and db.default_queue_policy is not None:
            if self.queue_policy is not None:
                raise ValueError("queue policy given twice: queue_policy and dynamic_batching.default_queue_policy")
            self.queue_policy, db.default_queue_policy = db.default_queue_policy, None
        if self.instance_group is not None:
            if self.instance_count is not None:
                raise ValueError("instance count given twice: instance_count and instance_group")
            self.instance_count = sum(g.count for g in self.instance_group)
            self.instance_group = None
        return self

    def manifest_options(self) -> dict:
        """The options that were set, under mmhost's names (nested models as dicts)."""
        out = self.model_dump(exclude_none=True, exclude={"instance_group"})
        if "dynamic_batching" in out:
            out["dynamic_batching"].pop("default_queue_policy", None)
        return out


def _model_class(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside `X | None` or `list[X] | None`, if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) in (typing.Union, list):
        for arg in typing.get_args(annotation):
            found = _model_class(arg)
            if found is not None:
                return found
    return None


def _known_keys(cls: type[BaseModel]) -> list[str]:
    keys = []
    for name, f in cls.model_fields.items():
        alias = f.validation_alias
        keys += [str(c) for c in alias.choices] if isinstance(alias, AliasChoices) else [name]
    return sorted(set(keys))


def _path(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def explain(e: ValidationError, root: type[BaseModel] = ModelOptions) -> str:
    """One line per problem, each naming the option's full path; unknown keys list what is known there."""
    lines = []
    for err in e.errors():
        loc = tuple(err["loc"])
        if err["type"] == "extra_forbidden":
            cls: type[BaseModel] | None = root
            for part in loc[:-1]:
                if cls is not None and isinstance(part, str):
                    field = cls.model_fields.get(part)
                    if field is None:  # reached through an alias
                        field = next((f for f in cls.model_fields.values() if isinstance(f.validation_alias, AliasChoices)
                                      and part in f.validation_alias.choices), None)
                    cls = _model_class(field.annotation) if field is not None else None
            keys = _known_keys(cls) if cls is not None else []
            if loc[-1] in keys:
                lines.append(f"option {_path(loc)} given twice (under mmhost's and Triton's name)")
                continue
            close = difflib.get_close_matches(str(loc[-1]), keys, n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            known = f" (known there: {', '.join(keys)})" if keys else ""
            lines.append(f"unknown option {_path(loc)}{hint}{known}")
        else:
            where = _path(loc)
            lines.append(f"{where}: {err['msg']}" if where else str(err["msg"]))
    return "; ".join(lines)


def parse_options(data: Any, source: str) -> ModelOptions:
    """Validate already-parsed YAML/JSON data."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigFileError(f"{source}: expected a mapping of manifest options, got {type(data).__name__}")
    try:
        return ModelOptions.model_validate(data)
    except ValidationError as e:
        raise ConfigFileError(f"{source}: {explain(e)}") from None


def is_pbtxt(path: Path, text: str) -> bool:
    """A Triton config by its extension, or by content: blocks without a colon (`input [`), which YAML has not,
    or top-level keys only Triton configs have (`platform`, `input`, ...)."""
    if path.suffix.lower() in PBTXT_SUFFIXES:
        return True
    if path.suffix.lower() in (".json", ".yaml", ".yml"):
        return False
    if _PBTXT_BLOCK.search(text):
        return True
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        return False
    return isinstance(data, dict) and bool(_TRITON_ONLY_KEYS & set(data))


def load_options(path: Path, warn: typing.Callable[[str], None] | None = None) -> ModelOptions:
    """Read and validate a config file of any dialect. Triton features mmhost does without are passed to `warn`;
    those it cannot honour (ensembles, other backends, sequence batching) raise ConfigFileError."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigFileError(f"{path}: {e}") from None
    if is_pbtxt(path, text):
        from mmhost.triton_config import TritonConfigError, parse_pbtxt

        try:
            cfg = parse_pbtxt(text, str(path))
        except TritonConfigError as e:
            raise ConfigFileError(str(e)) from None
        for w in cfg.warnings:
            (warn or (lambda _m: None))(f"{path}: {w}")
        return cfg.options
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigFileError(f"{path}: not valid JSON: {e}") from None
    else:
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ConfigFileError(f"{path}: not valid YAML: {e}") from None
    return parse_options(data, str(path))
