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
    __slots__ = ("tenant", "model", "version", "state", "memory_bytes", "queue_depth", "in_flight", "last_used_unix", "requests_per_s", "reason", "queue_ms_recent", "compute_ms_recent", "requests_total", "shed_total", "instances", "pinned")
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
    QUEUE_MS_RECENT_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_MS_RECENT_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    SHED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
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
    queue_ms_recent: float
    compute_ms_recent: float
    requests_total: int
    shed_total: int
    instances: int
    pinned: bool
    def __init__(self, tenant: _Optional[str] = ..., model: _Optional[str] = ..., version: _Optional[str] = ..., state: _Optional[str] = ..., memory_bytes: _Optional[int] = ..., queue_depth: _Optional[int] = ..., in_flight: _Optional[int] = ..., last_used_unix: _Optional[float] = ..., requests_per_s: _Optional[float] = ..., reason: _Optional[str] = ..., queue_ms_recent: _Optional[float] = ..., compute_ms_recent: _Optional[float] = ..., requests_total: _Optional[int] = ..., shed_total: _Optional[int] = ..., instances: _Optional[int] = ..., pinned: _Optional[bool] = ...) -> None: ...

class HostStatus(_message.Message):
    __slots__ = ("host_id", "address", "models", "device_memory_used", "device_memory_budget", "device_memory_total", "uptime_s", "draining", "sent_unix", "device", "cache_hits", "cache_misses", "requests_total", "shed_by_tenant", "requests_by_tenant", "execution_slots", "slots_busy", "slots_waiting", "host_group", "data_port")
    class ShedByTenantEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class RequestsByTenantEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
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
    CACHE_HITS_FIELD_NUMBER: _ClassVar[int]
    CACHE_MISSES_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    SHED_BY_TENANT_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_BY_TENANT_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_SLOTS_FIELD_NUMBER: _ClassVar[int]
    SLOTS_BUSY_FIELD_NUMBER: _ClassVar[int]
    SLOTS_WAITING_FIELD_NUMBER: _ClassVar[int]
    HOST_GROUP_FIELD_NUMBER: _ClassVar[int]
    DATA_PORT_FIELD_NUMBER: _ClassVar[int]
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
    cache_hits: int
    cache_misses: int
    requests_total: int
    shed_by_tenant: _containers.ScalarMap[str, int]
    requests_by_tenant: _containers.ScalarMap[str, int]
    execution_slots: int
    slots_busy: int
    slots_waiting: int
    host_group: str
    data_port: int
    def __init__(self, host_id: _Optional[str] = ..., address: _Optional[str] = ..., models: _Optional[_Iterable[_Union[ModelStatus, _Mapping]]] = ..., device_memory_used: _Optional[int] = ..., device_memory_budget: _Optional[int] = ..., device_memory_total: _Optional[int] = ..., uptime_s: _Optional[float] = ..., draining: _Optional[bool] = ..., sent_unix: _Optional[float] = ..., device: _Optional[str] = ..., cache_hits: _Optional[int] = ..., cache_misses: _Optional[int] = ..., requests_total: _Optional[int] = ..., shed_by_tenant: _Optional[_Mapping[str, int]] = ..., requests_by_tenant: _Optional[_Mapping[str, int]] = ..., execution_slots: _Optional[int] = ..., slots_busy: _Optional[int] = ..., slots_waiting: _Optional[int] = ..., host_group: _Optional[str] = ..., data_port: _Optional[int] = ...) -> None: ...
