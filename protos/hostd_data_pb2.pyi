from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ForwardedCalls(_message.Message):
    __slots__ = ("calls",)
    CALLS_FIELD_NUMBER: _ClassVar[int]
    calls: _containers.RepeatedCompositeFieldContainer[ForwardedCall]
    def __init__(self, calls: _Optional[_Iterable[_Union[ForwardedCall, _Mapping]]] = ...) -> None: ...

class ForwardedAnswers(_message.Message):
    __slots__ = ("answers",)
    ANSWERS_FIELD_NUMBER: _ClassVar[int]
    answers: _containers.RepeatedCompositeFieldContainer[ForwardedAnswer]
    def __init__(self, answers: _Optional[_Iterable[_Union[ForwardedAnswer, _Mapping]]] = ...) -> None: ...

class ForwardedCall(_message.Message):
    __slots__ = ("seq", "tenant", "timeout_us", "request")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_US_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    seq: int
    tenant: str
    timeout_us: int
    request: bytes
    def __init__(self, seq: _Optional[int] = ..., tenant: _Optional[str] = ..., timeout_us: _Optional[int] = ..., request: _Optional[bytes] = ...) -> None: ...

class Trailer(_message.Message):
    __slots__ = ("key", "value")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: str
    def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class ForwardedAnswer(_message.Message):
    __slots__ = ("seq", "code", "message", "trailers", "response")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TRAILERS_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    seq: int
    code: int
    message: str
    trailers: _containers.RepeatedCompositeFieldContainer[Trailer]
    response: bytes
    def __init__(self, seq: _Optional[int] = ..., code: _Optional[int] = ..., message: _Optional[str] = ..., trailers: _Optional[_Iterable[_Union[Trailer, _Mapping]]] = ..., response: _Optional[bytes] = ...) -> None: ...
