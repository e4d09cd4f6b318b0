from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class TokenRows(_message.Message):
    __slots__ = ("ids", "row_offsets", "markers", "marker_offsets", "qtypes", "position_ids", "option_ids", "tokenizer_fingerprint")
    IDS_FIELD_NUMBER: _ClassVar[int]
    ROW_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    MARKERS_FIELD_NUMBER: _ClassVar[int]
    MARKER_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    QTYPES_FIELD_NUMBER: _ClassVar[int]
    POSITION_IDS_FIELD_NUMBER: _ClassVar[int]
    OPTION_IDS_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    ids: bytes
    row_offsets: bytes
    markers: bytes
    marker_offsets: bytes
    qtypes: bytes
    position_ids: bytes
    option_ids: bytes
    tokenizer_fingerprint: str
    def __init__(self, ids: _Optional[bytes] = ..., row_offsets: _Optional[bytes] = ..., markers: _Optional[bytes] = ..., marker_offsets: _Optional[bytes] = ..., qtypes: _Optional[bytes] = ..., position_ids: _Optional[bytes] = ..., option_ids: _Optional[bytes] = ..., tokenizer_fingerprint: _Optional[str] = ...) -> None: ...

class CallOrigin(_message.Message):
    __slots__ = ("request_id", "traceparent")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TRACEPARENT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    traceparent: str
    def __init__(self, request_id: _Optional[str] = ..., traceparent: _Optional[str] = ...) -> None: ...

class CallError(_message.Message):
    __slots__ = ("kind", "detail", "status")
    KIND_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    kind: str
    detail: str
    status: bytes
    def __init__(self, kind: _Optional[str] = ..., detail: _Optional[str] = ..., status: _Optional[bytes] = ...) -> None: ...
