from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TensorSpec(_message.Message):
    __slots__ = ("name", "datatype", "shape")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DATATYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    datatype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, name: _Optional[str] = ..., datatype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ...) -> None: ...

class PublishHeader(_message.Message):
    __slots__ = ("model", "version", "format", "inputs", "outputs", "max_batch_size", "instance_count", "max_queue_delay_us", "description", "uploaded_by", "config_json", "size_bytes", "sha256")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_COUNT_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUE_DELAY_US_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    UPLOADED_BY_FIELD_NUMBER: _ClassVar[int]
    CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: str
    format: str
    inputs: _containers.RepeatedCompositeFieldContainer[TensorSpec]
    outputs: _containers.RepeatedCompositeFieldContainer[TensorSpec]
    max_batch_size: int
    instance_count: int
    max_queue_delay_us: int
    description: str
    uploaded_by: str
    config_json: str
    size_bytes: int
    sha256: str
    def __init__(self, model: _Optional[str] = ..., version: _Optional[str] = ..., format: _Optional[str] = ..., inputs: _Optional[_Iterable[_Union[TensorSpec, _Mapping]]] = ..., outputs: _Optional[_Iterable[_Union[TensorSpec, _Mapping]]] = ..., max_batch_size: _Optional[int] = ..., instance_count: _Optional[int] = ..., max_queue_delay_us: _Optional[int] = ..., description: _Optional[str] = ..., uploaded_by: _Optional[str] = ..., config_json: _Optional[str] = ..., size_bytes: _Optional[int] = ..., sha256: _Optional[str] = ...) -> None: ...

class PublishRequest(_message.Message):
    __slots__ = ("header", "chunk")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    header: PublishHeader
    chunk: bytes
    def __init__(self, header: _Optional[_Union[PublishHeader, _Mapping]] = ..., chunk: _Optional[bytes] = ...) -> None: ...

class PublishResponse(_message.Message):
    __slots__ = ("model", "version", "format", "size_bytes", "sha256", "max_batch_size", "indexed")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    INDEXED_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: str
    format: str
    size_bytes: int
    sha256: str
    max_batch_size: int
    indexed: bool
    def __init__(self, model: _Optional[str] = ..., version: _Optional[str] = ..., format: _Optional[str] = ..., size_bytes: _Optional[int] = ..., sha256: _Optional[str] = ..., max_batch_size: _Optional[int] = ..., indexed: _Optional[bool] = ...) -> None: ...
