from laya_proto.v1 import decision_pb2 as _decision_pb2
from laya_proto.v1 import tokens_pb2 as _tokens_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class QuestionText(_message.Message):
    __slots__ = ("id", "type", "instructions", "options", "option_order")
    ID_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    INSTRUCTIONS_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    OPTION_ORDER_FIELD_NUMBER: _ClassVar[int]
    id: str
    type: str
    instructions: str
    options: _containers.RepeatedScalarFieldContainer[str]
    option_order: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, id: _Optional[str] = ..., type: _Optional[str] = ..., instructions: _Optional[str] = ..., options: _Optional[_Iterable[str]] = ..., option_order: _Optional[_Iterable[int]] = ...) -> None: ...

class StateText(_message.Message):
    __slots__ = ("text", "keep_end")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    KEEP_END_FIELD_NUMBER: _ClassVar[int]
    text: str
    keep_end: bool
    def __init__(self, text: _Optional[str] = ..., keep_end: _Optional[bool] = ...) -> None: ...

class TokenizeRequest(_message.Message):
    __slots__ = ("checkpoint", "states", "questions", "max_len", "head_max_len", "origin")
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    STATES_FIELD_NUMBER: _ClassVar[int]
    QUESTIONS_FIELD_NUMBER: _ClassVar[int]
    MAX_LEN_FIELD_NUMBER: _ClassVar[int]
    HEAD_MAX_LEN_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    checkpoint: str
    states: _containers.RepeatedCompositeFieldContainer[StateText]
    questions: _containers.RepeatedCompositeFieldContainer[QuestionText]
    max_len: int
    head_max_len: int
    origin: _tokens_pb2.CallOrigin
    def __init__(self, checkpoint: _Optional[str] = ..., states: _Optional[_Iterable[_Union[StateText, _Mapping]]] = ..., questions: _Optional[_Iterable[_Union[QuestionText, _Mapping]]] = ..., max_len: _Optional[int] = ..., head_max_len: _Optional[int] = ..., origin: _Optional[_Union[_tokens_pb2.CallOrigin, _Mapping]] = ...) -> None: ...

class TokenizeResponse(_message.Message):
    __slots__ = ("rows", "rows_per_state", "usage", "tokenize_ms")
    ROWS_FIELD_NUMBER: _ClassVar[int]
    ROWS_PER_STATE_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    TOKENIZE_MS_FIELD_NUMBER: _ClassVar[int]
    rows: _tokens_pb2.TokenRows
    rows_per_state: int
    usage: _containers.RepeatedCompositeFieldContainer[_decision_pb2.Usage]
    tokenize_ms: float
    def __init__(self, rows: _Optional[_Union[_tokens_pb2.TokenRows, _Mapping]] = ..., rows_per_state: _Optional[int] = ..., usage: _Optional[_Iterable[_Union[_decision_pb2.Usage, _Mapping]]] = ..., tokenize_ms: _Optional[float] = ...) -> None: ...

class TokenizerInfoRequest(_message.Message):
    __slots__ = ("checkpoint",)
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    checkpoint: str
    def __init__(self, checkpoint: _Optional[str] = ...) -> None: ...

class TokenizerInfo(_message.Message):
    __slots__ = ("entries",)
    class Entry(_message.Message):
        __slots__ = ("checkpoint", "fingerprint", "max_len", "head_max_len", "parallel_layout", "pad_id")
        CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
        FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
        MAX_LEN_FIELD_NUMBER: _ClassVar[int]
        HEAD_MAX_LEN_FIELD_NUMBER: _ClassVar[int]
        PARALLEL_LAYOUT_FIELD_NUMBER: _ClassVar[int]
        PAD_ID_FIELD_NUMBER: _ClassVar[int]
        checkpoint: str
        fingerprint: str
        max_len: int
        head_max_len: int
        parallel_layout: bool
        pad_id: int
        def __init__(self, checkpoint: _Optional[str] = ..., fingerprint: _Optional[str] = ..., max_len: _Optional[int] = ..., head_max_len: _Optional[int] = ..., parallel_layout: _Optional[bool] = ..., pad_id: _Optional[int] = ...) -> None: ...
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[TokenizerInfo.Entry]
    def __init__(self, entries: _Optional[_Iterable[_Union[TokenizerInfo.Entry, _Mapping]]] = ...) -> None: ...

class TokenizeCall(_message.Message):
    __slots__ = ("id", "request")
    ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    id: int
    request: TokenizeRequest
    def __init__(self, id: _Optional[int] = ..., request: _Optional[_Union[TokenizeRequest, _Mapping]] = ...) -> None: ...

class TokenizeReply(_message.Message):
    __slots__ = ("id", "response", "error")
    ID_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    id: int
    response: TokenizeResponse
    error: _tokens_pb2.CallError
    def __init__(self, id: _Optional[int] = ..., response: _Optional[_Union[TokenizeResponse, _Mapping]] = ..., error: _Optional[_Union[_tokens_pb2.CallError, _Mapping]] = ...) -> None: ...
