from laya_proto.v1 import status_pb2 as _status_pb2
from laya_proto.v1 import tokens_pb2 as _tokens_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Question(_message.Message):
    __slots__ = ("id", "type", "instructions", "instructions_json", "criteria_json", "labels", "option_order")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    INSTRUCTIONS_FIELD_NUMBER: _ClassVar[int]
    INSTRUCTIONS_JSON_FIELD_NUMBER: _ClassVar[int]
    CRITERIA_JSON_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    OPTION_ORDER_FIELD_NUMBER: _ClassVar[int]
    id: str
    type: str
    instructions: str
    instructions_json: str
    criteria_json: str
    labels: _containers.ScalarMap[str, str]
    option_order: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, id: _Optional[str] = ..., type: _Optional[str] = ..., instructions: _Optional[str] = ..., instructions_json: _Optional[str] = ..., criteria_json: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., option_order: _Optional[_Iterable[int]] = ...) -> None: ...

class DecideRequest(_message.Message):
    __slots__ = ("text", "state_json", "questions", "model", "task", "lang", "lang_guess", "max_len", "head_max_len", "min_confidence_json", "request_json")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    STATE_JSON_FIELD_NUMBER: _ClassVar[int]
    QUESTIONS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    LANG_FIELD_NUMBER: _ClassVar[int]
    LANG_GUESS_FIELD_NUMBER: _ClassVar[int]
    MAX_LEN_FIELD_NUMBER: _ClassVar[int]
    HEAD_MAX_LEN_FIELD_NUMBER: _ClassVar[int]
    MIN_CONFIDENCE_JSON_FIELD_NUMBER: _ClassVar[int]
    REQUEST_JSON_FIELD_NUMBER: _ClassVar[int]
    text: str
    state_json: str
    questions: _containers.RepeatedCompositeFieldContainer[Question]
    model: str
    task: str
    lang: str
    lang_guess: str
    max_len: int
    head_max_len: int
    min_confidence_json: str
    request_json: str
    def __init__(self, text: _Optional[str] = ..., state_json: _Optional[str] = ..., questions: _Optional[_Iterable[_Union[Question, _Mapping]]] = ..., model: _Optional[str] = ..., task: _Optional[str] = ..., lang: _Optional[str] = ..., lang_guess: _Optional[str] = ..., max_len: _Optional[int] = ..., head_max_len: _Optional[int] = ..., min_confidence_json: _Optional[str] = ..., request_json: _Optional[str] = ...) -> None: ...

class Answer(_message.Message):
    __slots__ = ("id", "type", "choice_json", "score", "noul", "probabilities", "legend", "confidence", "answer_confidence", "act_probability", "abstention", "abstention_threshold", "low_confidence")
    class Prob(_message.Message):
        __slots__ = ("label", "p")
        LABEL_FIELD_NUMBER: _ClassVar[int]
        P_FIELD_NUMBER: _ClassVar[int]
        label: str
        p: float
        def __init__(self, label: _Optional[str] = ..., p: _Optional[float] = ...) -> None: ...
    class LegendEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    CHOICE_JSON_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    NOUL_FIELD_NUMBER: _ClassVar[int]
    PROBABILITIES_FIELD_NUMBER: _ClassVar[int]
    LEGEND_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    ANSWER_CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    ACT_PROBABILITY_FIELD_NUMBER: _ClassVar[int]
    ABSTENTION_FIELD_NUMBER: _ClassVar[int]
    ABSTENTION_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    LOW_CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    id: str
    type: str
    choice_json: str
    score: float
    noul: float
    probabilities: _containers.RepeatedCompositeFieldContainer[Answer.Prob]
    legend: _containers.ScalarMap[str, str]
    confidence: float
    answer_confidence: float
    act_probability: float
    abstention: str
    abstention_threshold: float
    low_confidence: bool
    def __init__(self, id: _Optional[str] = ..., type: _Optional[str] = ..., choice_json: _Optional[str] = ..., score: _Optional[float] = ..., noul: _Optional[float] = ..., probabilities: _Optional[_Iterable[_Union[Answer.Prob, _Mapping]]] = ..., legend: _Optional[_Mapping[str, str]] = ..., confidence: _Optional[float] = ..., answer_confidence: _Optional[float] = ..., act_probability: _Optional[float] = ..., abstention: _Optional[str] = ..., abstention_threshold: _Optional[float] = ..., low_confidence: _Optional[bool] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("input_tokens", "output_tokens", "state_tokens", "state_tokens_dropped", "truncated", "truncated_questions")
    INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STATE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STATE_TOKENS_DROPPED_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_QUESTIONS_FIELD_NUMBER: _ClassVar[int]
    input_tokens: int
    output_tokens: int
    state_tokens: int
    state_tokens_dropped: int
    truncated: bool
    truncated_questions: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, input_tokens: _Optional[int] = ..., output_tokens: _Optional[int] = ..., state_tokens: _Optional[int] = ..., state_tokens_dropped: _Optional[int] = ..., truncated: _Optional[bool] = ..., truncated_questions: _Optional[_Iterable[str]] = ...) -> None: ...

class Routing(_message.Message):
    __slots__ = ("model", "repo", "reason", "detection_json", "workflow")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    REPO_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DETECTION_JSON_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    model: str
    repo: str
    reason: str
    detection_json: str
    workflow: str
    def __init__(self, model: _Optional[str] = ..., repo: _Optional[str] = ..., reason: _Optional[str] = ..., detection_json: _Optional[str] = ..., workflow: _Optional[str] = ...) -> None: ...

class DecideResponse(_message.Message):
    __slots__ = ("answers", "usage", "routing", "json", "inference_ms")
    ANSWERS_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    ROUTING_FIELD_NUMBER: _ClassVar[int]
    JSON_FIELD_NUMBER: _ClassVar[int]
    INFERENCE_MS_FIELD_NUMBER: _ClassVar[int]
    answers: _containers.RepeatedCompositeFieldContainer[Answer]
    usage: Usage
    routing: Routing
    json: str
    inference_ms: float
    def __init__(self, answers: _Optional[_Iterable[_Union[Answer, _Mapping]]] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., routing: _Optional[_Union[Routing, _Mapping]] = ..., json: _Optional[str] = ..., inference_ms: _Optional[float] = ...) -> None: ...

class DecideBatchRequest(_message.Message):
    __slots__ = ("states_json", "questions", "model", "task", "lang", "lang_guess", "max_len", "head_max_len", "min_confidence_json", "request_json")
    STATES_JSON_FIELD_NUMBER: _ClassVar[int]
    QUESTIONS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    LANG_FIELD_NUMBER: _ClassVar[int]
    LANG_GUESS_FIELD_NUMBER: _ClassVar[int]
    MAX_LEN_FIELD_NUMBER: _ClassVar[int]
    HEAD_MAX_LEN_FIELD_NUMBER: _ClassVar[int]
    MIN_CONFIDENCE_JSON_FIELD_NUMBER: _ClassVar[int]
    REQUEST_JSON_FIELD_NUMBER: _ClassVar[int]
    states_json: _containers.RepeatedScalarFieldContainer[str]
    questions: _containers.RepeatedCompositeFieldContainer[Question]
    model: str
    task: str
    lang: str
    lang_guess: str
    max_len: int
    head_max_len: int
    min_confidence_json: str
    request_json: str
    def __init__(self, states_json: _Optional[_Iterable[str]] = ..., questions: _Optional[_Iterable[_Union[Question, _Mapping]]] = ..., model: _Optional[str] = ..., task: _Optional[str] = ..., lang: _Optional[str] = ..., lang_guess: _Optional[str] = ..., max_len: _Optional[int] = ..., head_max_len: _Optional[int] = ..., min_confidence_json: _Optional[str] = ..., request_json: _Optional[str] = ...) -> None: ...

class DecideBatchResponse(_message.Message):
    __slots__ = ("results", "json", "inference_ms")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    JSON_FIELD_NUMBER: _ClassVar[int]
    INFERENCE_MS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[DecideResponse]
    json: str
    inference_ms: float
    def __init__(self, results: _Optional[_Iterable[_Union[DecideResponse, _Mapping]]] = ..., json: _Optional[str] = ..., inference_ms: _Optional[float] = ...) -> None: ...

class StatusEvent(_message.Message):
    __slots__ = ("sequence", "time_unix", "ready", "reason", "services")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    TIME_UNIX_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SERVICES_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    time_unix: float
    ready: bool
    reason: str
    services: _containers.RepeatedCompositeFieldContainer[_status_pb2.ServiceStatus]
    def __init__(self, sequence: _Optional[int] = ..., time_unix: _Optional[float] = ..., ready: _Optional[bool] = ..., reason: _Optional[str] = ..., services: _Optional[_Iterable[_Union[_status_pb2.ServiceStatus, _Mapping]]] = ...) -> None: ...

class DecideCall(_message.Message):
    __slots__ = ("id", "request")
    ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    id: int
    request: DecideRequest
    def __init__(self, id: _Optional[int] = ..., request: _Optional[_Union[DecideRequest, _Mapping]] = ...) -> None: ...

class DecideReply(_message.Message):
    __slots__ = ("id", "response", "error")
    ID_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    id: int
    response: DecideResponse
    error: _tokens_pb2.CallError
    def __init__(self, id: _Optional[int] = ..., response: _Optional[_Union[DecideResponse, _Mapping]] = ..., error: _Optional[_Union[_tokens_pb2.CallError, _Mapping]] = ...) -> None: ...
