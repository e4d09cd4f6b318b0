from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class State(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STATE_UNSPECIFIED: _ClassVar[State]
    STATE_STARTING: _ClassVar[State]
    STATE_LOADING: _ClassVar[State]
    STATE_WARMING: _ClassVar[State]
    STATE_READY: _ClassVar[State]
    STATE_PREPARING: _ClassVar[State]
    STATE_FAILED: _ClassVar[State]
    STATE_DRAINING: _ClassVar[State]
    STATE_DOWN: _ClassVar[State]
    STATE_CONFIGURED: _ClassVar[State]
STATE_UNSPECIFIED: State
STATE_STARTING: State
STATE_LOADING: State
STATE_WARMING: State
STATE_READY: State
STATE_PREPARING: State
STATE_FAILED: State
STATE_DRAINING: State
STATE_DOWN: State
STATE_CONFIGURED: State

class CheckpointStatus(_message.Message):
    __slots__ = ("name", "state", "detail", "source", "revision", "sha256", "backend", "device", "dtype", "load_ms", "warmup_ms", "config_json", "max_len", "head_max_len", "tokenizer_fingerprint", "device_fallback", "device_requested", "last_used_unix", "max_row_tokens", "kernels", "row_layout", "temperatures")
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    LOAD_MS_FIELD_NUMBER: _ClassVar[int]
    WARMUP_MS_FIELD_NUMBER: _ClassVar[int]
    CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    MAX_LEN_FIELD_NUMBER: _ClassVar[int]
    HEAD_MAX_LEN_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FALLBACK_FIELD_NUMBER: _ClassVar[int]
    DEVICE_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    LAST_USED_UNIX_FIELD_NUMBER: _ClassVar[int]
    MAX_ROW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    KERNELS_FIELD_NUMBER: _ClassVar[int]
    ROW_LAYOUT_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURES_FIELD_NUMBER: _ClassVar[int]
    name: str
    state: State
    detail: str
    source: str
    revision: str
    sha256: str
    backend: str
    device: str
    dtype: str
    load_ms: float
    warmup_ms: float
    config_json: str
    max_len: int
    head_max_len: int
    tokenizer_fingerprint: str
    device_fallback: bool
    device_requested: str
    last_used_unix: float
    max_row_tokens: int
    kernels: str
    row_layout: str
    temperatures: Temperatures
    def __init__(self, name: _Optional[str] = ..., state: _Optional[_Union[State, str]] = ..., detail: _Optional[str] = ..., source: _Optional[str] = ..., revision: _Optional[str] = ..., sha256: _Optional[str] = ..., backend: _Optional[str] = ..., device: _Optional[str] = ..., dtype: _Optional[str] = ..., load_ms: _Optional[float] = ..., warmup_ms: _Optional[float] = ..., config_json: _Optional[str] = ..., max_len: _Optional[int] = ..., head_max_len: _Optional[int] = ..., tokenizer_fingerprint: _Optional[str] = ..., device_fallback: _Optional[bool] = ..., device_requested: _Optional[str] = ..., last_used_unix: _Optional[float] = ..., max_row_tokens: _Optional[int] = ..., kernels: _Optional[str] = ..., row_layout: _Optional[str] = ..., temperatures: _Optional[_Union[Temperatures, _Mapping]] = ...) -> None: ...

class Temperatures(_message.Message):
    __slots__ = ("choice", "score", "noul", "by_options")
    class ByOptionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    CHOICE_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    NOUL_FIELD_NUMBER: _ClassVar[int]
    BY_OPTIONS_FIELD_NUMBER: _ClassVar[int]
    choice: float
    score: float
    noul: float
    by_options: _containers.ScalarMap[str, float]
    def __init__(self, choice: _Optional[float] = ..., score: _Optional[float] = ..., noul: _Optional[float] = ..., by_options: _Optional[_Mapping[str, float]] = ...) -> None: ...

class ServiceStatus(_message.Message):
    __slots__ = ("service", "state", "detail", "instance_id", "sequence", "time_unix", "started_unix", "queue_depth", "inflight", "checkpoints", "address", "restarts", "version")
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    TIME_UNIX_FIELD_NUMBER: _ClassVar[int]
    STARTED_UNIX_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    service: str
    state: State
    detail: str
    instance_id: str
    sequence: int
    time_unix: float
    started_unix: float
    queue_depth: int
    inflight: int
    checkpoints: _containers.RepeatedCompositeFieldContainer[CheckpointStatus]
    address: str
    restarts: int
    version: str
    def __init__(self, service: _Optional[str] = ..., state: _Optional[_Union[State, str]] = ..., detail: _Optional[str] = ..., instance_id: _Optional[str] = ..., sequence: _Optional[int] = ..., time_unix: _Optional[float] = ..., started_unix: _Optional[float] = ..., queue_depth: _Optional[int] = ..., inflight: _Optional[int] = ..., checkpoints: _Optional[_Iterable[_Union[CheckpointStatus, _Mapping]]] = ..., address: _Optional[str] = ..., restarts: _Optional[int] = ..., version: _Optional[str] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ("heartbeat_s",)
    HEARTBEAT_S_FIELD_NUMBER: _ClassVar[int]
    heartbeat_s: float
    def __init__(self, heartbeat_s: _Optional[float] = ...) -> None: ...
