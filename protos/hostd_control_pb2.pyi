from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ModelStatus(_message.Message):
    __slots__ = ("tenant", "model", "version", "state", "memory_bytes", "queue_depth", "in_flight", "last_used_unix", "requests_per_s", "reason")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    LAST_USED_UNIX_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_PER_S_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    model: str
    version: str
    state: str
    memory_bytes: int
    queue_depth: int
    in_flight: int
    last_used_unix: float
    requests_per_s: float
    reason: str
    def __init__(self, tenant: _Optional[str] = ..., model: _Optional[str] = ..., version: _Optional[str] = ..., state: _Optional[str] = ..., memory_bytes: _Optional[int] = ..., queue_depth: _Optional[int] = ..., in_flight: _Optional[int] = ..., last_used_unix: _Optional[float] = ..., requests_per_s: _Optional[float] = ..., reason: _Optional[str] = ...) -> None: ...

class HostStatus(_message.Message):
    __slots__ = ("host_id", "address", "models", "device_memory_used", "device_memory_budget", "device_memory_total", "uptime_s", "draining", "sent_unix", "device")
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_MEMORY_USED_FIELD_NUMBER: _ClassVar[int]
    DEVICE_MEMORY_BUDGET_FIELD_NUMBER: _ClassVar[int]
    DEVICE_MEMORY_TOTAL_FIELD_NUMBER: _ClassVar[int]
    UPTIME_S_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    SENT_UNIX_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    address: str
    models: _containers.RepeatedCompositeFieldContainer[ModelStatus]
    device_memory_used: int
    device_memory_budget: int
    device_memory_total: int
    uptime_s: float
    draining: bool
    sent_unix: float
    device: str
    def __init__(self, host_id: _Optional[str] = ..., address: _Optional[str] = ..., models: _Optional[_Iterable[_Union[ModelStatus, _Mapping]]] = ..., device_memory_used: _Optional[int] = ..., device_memory_budget: _Optional[int] = ..., device_memory_total: _Optional[int] = ..., uptime_s: _Optional[float] = ..., draining: _Optional[bool] = ..., sent_unix: _Optional[float] = ..., device: _Optional[str] = ...) -> None: ...
