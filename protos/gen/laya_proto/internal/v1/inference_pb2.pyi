from laya_proto.v1 import tokens_pb2 as _tokens_pb2
from laya_proto.v1 import status_pb2 as _status_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class InferRequest(_message.Message):
    __slots__ = ("checkpoint", "rows", "origins")
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    ORIGINS_FIELD_NUMBER: _ClassVar[int]
    checkpoint: str
    rows: _tokens_pb2.TokenRows
    origins: _containers.RepeatedCompositeFieldContainer[_tokens_pb2.CallOrigin]
    def __init__(self, checkpoint: _Optional[str] = ..., rows: _Optional[_Union[_tokens_pb2.TokenRows, _Mapping]] = ..., origins: _Optional[_Iterable[_Union[_tokens_pb2.CallOrigin, _Mapping]]] = ...) -> None: ...

class InferResponse(_message.Message):
    __slots__ = ("logits", "act_logits", "n_act", "device", "dtype", "queue_ms", "model_ms", "batch_rows")
    LOGITS_FIELD_NUMBER: _ClassVar[int]
    ACT_LOGITS_FIELD_NUMBER: _ClassVar[int]
    N_ACT_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_MS_FIELD_NUMBER: _ClassVar[int]
    MODEL_MS_FIELD_NUMBER: _ClassVar[int]
    BATCH_ROWS_FIELD_NUMBER: _ClassVar[int]
    logits: bytes
    act_logits: bytes
    n_act: int
    device: str
    dtype: str
    queue_ms: float
    model_ms: float
    batch_rows: int
    def __init__(self, logits: _Optional[bytes] = ..., act_logits: _Optional[bytes] = ..., n_act: _Optional[int] = ..., device: _Optional[str] = ..., dtype: _Optional[str] = ..., queue_ms: _Optional[float] = ..., model_ms: _Optional[float] = ..., batch_rows: _Optional[int] = ...) -> None: ...

class InferCall(_message.Message):
    __slots__ = ("id", "request")
    ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    id: int
    request: InferRequest
    def __init__(self, id: _Optional[int] = ..., request: _Optional[_Union[InferRequest, _Mapping]] = ...) -> None: ...

class InferReply(_message.Message):
    __slots__ = ("id", "response", "error")
    ID_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    id: int
    response: InferResponse
    error: _tokens_pb2.CallError
    def __init__(self, id: _Optional[int] = ..., response: _Optional[_Union[InferResponse, _Mapping]] = ..., error: _Optional[_Union[_tokens_pb2.CallError, _Mapping]] = ...) -> None: ...

class ListCheckpointsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListCheckpointsResponse(_message.Message):
    __slots__ = ("checkpoints",)
    CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    checkpoints: _containers.RepeatedCompositeFieldContainer[_status_pb2.CheckpointStatus]
    def __init__(self, checkpoints: _Optional[_Iterable[_Union[_status_pb2.CheckpointStatus, _Mapping]]] = ...) -> None: ...

class LoadCheckpointRequest(_message.Message):
    __slots__ = ("checkpoint",)
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    checkpoint: str
    def __init__(self, checkpoint: _Optional[str] = ...) -> None: ...
