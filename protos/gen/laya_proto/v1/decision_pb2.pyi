from laya_proto.v1 import status_pb2 as _status_pb2
from laya_proto.v1 import tokens_pb2 as _tokens_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class QuestionType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    QUESTION_TYPE_UNSPECIFIED: _ClassVar[QuestionType]
    QUESTION_TYPE_CHOICE: _ClassVar[QuestionType]
    QUESTION_TYPE_SCORE: _ClassVar[QuestionType]
    QUESTION_TYPE_NOUL: _ClassVar[QuestionType]

class Abstention(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ABSTENTION_UNSPECIFIED: _ClassVar[Abstention]
    ABSTENTION_PASSED: _ClassVar[Abstention]
    ABSTENTION_ABSTAINED: _ClassVar[Abstention]
    ABSTENTION_UNEVALUATED: _ClassVar[Abstention]
QUESTION_TYPE_UNSPECIFIED: QuestionType
QUESTION_TYPE_CHOICE: QuestionType
QUESTION_TYPE_SCORE: QuestionType
QUESTION_TYPE_NOUL: QuestionType
ABSTENTION_UNSPECIFIED: Abstention
ABSTENTION_PASSED: Abstention
ABSTENTION_ABSTAINED: Abstention
ABSTENTION_UNEVALUATED: Abstention

class Label(_message.Message):
    __slots__ = ("string_value", "int_value", "number_value", "bool_value")
    STRING_VALUE_FIELD_NUMBER: _ClassVar[int]
    INT_VALUE_FIELD_NUMBER: _ClassVar[int]
    NUMBER_VALUE_FIELD_NUMBER: _ClassVar[int]
    BOOL_VALUE_FIELD_NUMBER: _ClassVar[int]
    string_value: str
    int_value: int
    number_value: float
    bool_value: bool
    def __init__(self, string_value: _Optional[str] = ..., int_value: _Optional[int] = ..., number_value: _Optional[float] = ..., bool_value: _Optional[bool] = ...) -> None: ...

class Criterion(_message.Message):
    __slots__ = ("label", "description")
    LABEL_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    label: Label
    description: str
    def __init__(self, label: _Optional[_Union[Label, _Mapping]] = ..., description: _Optional[str] = ...) -> None: ...

class NoulLabels(_message.Message):
    __slots__ = ("false_label", "true_label")
    FALSE_LABEL_FIELD_NUMBER: _ClassVar[int]
    TRUE_LABEL_FIELD_NUMBER: _ClassVar[int]
    false_label: str
    true_label: str
    def __init__(self, false_label: _Optional[str] = ..., true_label: _Optional[str] = ...) -> None: ...

class Question(_message.Message):
    __slots__ = ("id", "type", "instructions_text", "instructions_json", "criteria", "labels", "option_order")
    ID_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    INSTRUCTIONS_TEXT_FIELD_NUMBER: _ClassVar[int]
    INSTRUCTIONS_JSON_FIELD_NUMBER: _ClassVar[int]
    CRITERIA_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    OPTION_ORDER_FIELD_NUMBER: _ClassVar[int]
    id: str
    type: QuestionType
    instructions_text: str
    instructions_json: str
    criteria: _containers.RepeatedCompositeFieldContainer[Criterion]
    labels: NoulLabels
    option_order: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, id: _Optional[str] = ..., type: _Optional[_Union[QuestionType, str]] = ..., instructions_text: _Optional[str] = ..., instructions_json: _Optional[str] = ..., criteria: _Optional[_Iterable[_Union[Criterion, _Mapping]]] = ..., labels: _Optional[_Union[NoulLabels, _Mapping]] = ..., option_order: _Optional[_Iterable[int]] = ...) -> None: ...

class StateValue(_message.Message):
    __slots__ = ("text", "json")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    JSON_FIELD_NUMBER: _ClassVar[int]
    text: str
    json: str
    def __init__(self, text: _Optional[str] = ..., json: _Optional[str] = ...) -> None: ...

class ConfidenceBuckets(_message.Message):
    __slots__ = ("thresholds",)
    class ThresholdsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    THRESHOLDS_FIELD_NUMBER: _ClassVar[int]
    thresholds: _containers.ScalarMap[str, float]
    def __init__(self, thresholds: _Optional[_Mapping[str, float]] = ...) -> None: ...

class DecideRequest(_message.Message):
    __slots__ = ("state", "questions", "model", "task", "lang", "lang_guess", "max_len", "head_max_len", "min_confidence_all", "min_confidence_buckets", "request_json", "include_json")
    STATE_FIELD_NUMBER: _ClassVar[int]
    QUESTIONS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    LANG_FIELD_NUMBER: _ClassVar[int]
    LANG_GUESS_FIELD_NUMBER: _ClassVar[int]
    MAX_LEN_FIELD_NUMBER: _ClassVar[int]
    HEAD_MAX_LEN_FIELD_NUMBER: _ClassVar[int]
    MIN_CONFIDENCE_ALL_FIELD_NUMBER: _ClassVar[int]
    MIN_CONFIDENCE_BUCKETS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_JSON_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_JSON_FIELD_NUMBER: _ClassVar[int]
    state: StateValue
    questions: _containers.RepeatedCompositeFieldContainer[Question]
    model: str
    task: str
    lang: str
    lang_guess: str
    max_len: int
    head_max_len: int
    min_confidence_all: float
    min_confidence_buckets: ConfidenceBuckets
    request_json: str
    include_json: bool
    def __init__(self, state: _Optional[_Union[StateValue, _Mapping]] = ..., questions: _Optional[_Iterable[_Union[Question, _Mapping]]] = ..., model: _Optional[str] = ..., task: _Optional[str] = ..., lang: _Optional[str] = ..., lang_guess: _Optional[str] = ..., max_len: _Optional[int] = ..., head_max_len: _Optional[int] = ..., min_confidence_all: _Optional[float] = ..., min_confidence_buckets: _Optional[_Union[ConfidenceBuckets, _Mapping]] = ..., request_json: _Optional[str] = ..., include_json: _Optional[bool] = ...) -> None: ...

class LabelProbability(_message.Message):
    __slots__ = ("label", "probability")
    LABEL_FIELD_NUMBER: _ClassVar[int]
    PROBABILITY_FIELD_NUMBER: _ClassVar[int]
    label: Label
    probability: float
    def __init__(self, label: _Optional[_Union[Label, _Mapping]] = ..., probability: _Optional[float] = ...) -> None: ...

class ChoiceAnswer(_message.Message):
    __slots__ = ("choice", "probabilities", "x_jev_confidence")
    CHOICE_FIELD_NUMBER: _ClassVar[int]
    PROBABILITIES_FIELD_NUMBER: _ClassVar[int]
    X_JEV_CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    choice: Label
    probabilities: _containers.RepeatedCompositeFieldContainer[LabelProbability]
    x_jev_confidence: float
    def __init__(self, choice: _Optional[_Union[Label, _Mapping]] = ..., probabilities: _Optional[_Iterable[_Union[LabelProbability, _Mapping]]] = ..., x_jev_confidence: _Optional[float] = ...) -> None: ...

class ScoreAnswer(_message.Message):
    __slots__ = ("score", "legend", "probabilities", "x_jev_confidence")
    SCORE_FIELD_NUMBER: _ClassVar[int]
    LEGEND_FIELD_NUMBER: _ClassVar[int]
    PROBABILITIES_FIELD_NUMBER: _ClassVar[int]
    X_JEV_CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    score: float
    legend: _containers.RepeatedScalarFieldContainer[str]
    probabilities: _containers.RepeatedScalarFieldContainer[float]
    x_jev_confidence: float
    def __init__(self, score: _Optional[float] = ..., legend: _Optional[_Iterable[str]] = ..., probabilities: _Optional[_Iterable[float]] = ..., x_jev_confidence: _Optional[float] = ...) -> None: ...

class NoulAnswer(_message.Message):
    __slots__ = ("noul",)
    NOUL_FIELD_NUMBER: _ClassVar[int]
    noul: float
    def __init__(self, noul: _Optional[float] = ...) -> None: ...

class Action(_message.Message):
    __slots__ = ("act_probability",)
    ACT_PROBABILITY_FIELD_NUMBER: _ClassVar[int]
    act_probability: float
    def __init__(self, act_probability: _Optional[float] = ...) -> None: ...

class Answer(_message.Message):
    __slots__ = ("id", "type", "choice", "score", "noul", "confidence", "answer_confidence", "action", "low_confidence", "abstention", "abstention_threshold")
    ID_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    CHOICE_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    NOUL_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    ANSWER_CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    LOW_CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    ABSTENTION_FIELD_NUMBER: _ClassVar[int]
    ABSTENTION_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    id: str
    type: QuestionType
    choice: ChoiceAnswer
    score: ScoreAnswer
    noul: NoulAnswer
    confidence: float
    answer_confidence: float
    action: Action
    low_confidence: bool
    abstention: Abstention
    abstention_threshold: float
    def __init__(self, id: _Optional[str] = ..., type: _Optional[_Union[QuestionType, str]] = ..., choice: _Optional[_Union[ChoiceAnswer, _Mapping]] = ..., score: _Optional[_Union[ScoreAnswer, _Mapping]] = ..., noul: _Optional[_Union[NoulAnswer, _Mapping]] = ..., confidence: _Optional[float] = ..., answer_confidence: _Optional[float] = ..., action: _Optional[_Union[Action, _Mapping]] = ..., low_confidence: _Optional[bool] = ..., abstention: _Optional[_Union[Abstention, str]] = ..., abstention_threshold: _Optional[float] = ...) -> None: ...

class OptionsCollapsed(_message.Message):
    __slots__ = ("total", "distinct", "tokens_per_option")
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    DISTINCT_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_OPTION_FIELD_NUMBER: _ClassVar[int]
    total: int
    distinct: int
    tokens_per_option: int
    def __init__(self, total: _Optional[int] = ..., distinct: _Optional[int] = ..., tokens_per_option: _Optional[int] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("input_tokens", "output_tokens", "state_tokens", "state_tokens_dropped", "truncated", "truncated_questions", "options")
    class OptionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: OptionsCollapsed
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[OptionsCollapsed, _Mapping]] = ...) -> None: ...
    INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STATE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STATE_TOKENS_DROPPED_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_QUESTIONS_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    input_tokens: int
    output_tokens: int
    state_tokens: int
    state_tokens_dropped: int
    truncated: bool
    truncated_questions: _containers.RepeatedScalarFieldContainer[str]
    options: _containers.MessageMap[str, OptionsCollapsed]
    def __init__(self, input_tokens: _Optional[int] = ..., output_tokens: _Optional[int] = ..., state_tokens: _Optional[int] = ..., state_tokens_dropped: _Optional[int] = ..., truncated: _Optional[bool] = ..., truncated_questions: _Optional[_Iterable[str]] = ..., options: _Optional[_Mapping[str, OptionsCollapsed]] = ...) -> None: ...

class Detection(_message.Message):
    __slots__ = ("script", "script_profile", "language", "is_english", "language_undecided", "diacritic_rate", "non_latin_fraction", "mixed_segment")
    class ScriptProfileEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    SCRIPT_FIELD_NUMBER: _ClassVar[int]
    SCRIPT_PROFILE_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    IS_ENGLISH_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_UNDECIDED_FIELD_NUMBER: _ClassVar[int]
    DIACRITIC_RATE_FIELD_NUMBER: _ClassVar[int]
    NON_LATIN_FRACTION_FIELD_NUMBER: _ClassVar[int]
    MIXED_SEGMENT_FIELD_NUMBER: _ClassVar[int]
    script: str
    script_profile: _containers.ScalarMap[str, float]
    language: str
    is_english: bool
    language_undecided: bool
    diacritic_rate: float
    non_latin_fraction: float
    mixed_segment: str
    def __init__(self, script: _Optional[str] = ..., script_profile: _Optional[_Mapping[str, float]] = ..., language: _Optional[str] = ..., is_english: _Optional[bool] = ..., language_undecided: _Optional[bool] = ..., diacritic_rate: _Optional[float] = ..., non_latin_fraction: _Optional[float] = ..., mixed_segment: _Optional[str] = ...) -> None: ...

class Routing(_message.Message):
    __slots__ = ("model", "repo", "reason", "detection", "workflow")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    REPO_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DETECTION_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    model: str
    repo: str
    reason: str
    detection: Detection
    workflow: str
    def __init__(self, model: _Optional[str] = ..., repo: _Optional[str] = ..., reason: _Optional[str] = ..., detection: _Optional[_Union[Detection, _Mapping]] = ..., workflow: _Optional[str] = ...) -> None: ...

class DecideResponse(_message.Message):
    __slots__ = ("model", "answers", "usage", "routing", "json", "inference_ms")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ANSWERS_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    ROUTING_FIELD_NUMBER: _ClassVar[int]
    JSON_FIELD_NUMBER: _ClassVar[int]
    INFERENCE_MS_FIELD_NUMBER: _ClassVar[int]
    model: str
    answers: _containers.RepeatedCompositeFieldContainer[Answer]
    usage: Usage
    routing: Routing
    json: str
    inference_ms: float
    def __init__(self, model: _Optional[str] = ..., answers: _Optional[_Iterable[_Union[Answer, _Mapping]]] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., routing: _Optional[_Union[Routing, _Mapping]] = ..., json: _Optional[str] = ..., inference_ms: _Optional[float] = ...) -> None: ...

class DecideBatchRequest(_message.Message):
    __slots__ = ("states", "questions", "model", "task", "lang", "lang_guess", "max_len", "head_max_len", "min_confidence_all", "min_confidence_buckets", "request_json", "include_json")
    STATES_FIELD_NUMBER: _ClassVar[int]
    QUESTIONS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    LANG_FIELD_NUMBER: _ClassVar[int]
    LANG_GUESS_FIELD_NUMBER: _ClassVar[int]
    MAX_LEN_FIELD_NUMBER: _ClassVar[int]
    HEAD_MAX_LEN_FIELD_NUMBER: _ClassVar[int]
    MIN_CONFIDENCE_ALL_FIELD_NUMBER: _ClassVar[int]
    MIN_CONFIDENCE_BUCKETS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_JSON_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_JSON_FIELD_NUMBER: _ClassVar[int]
    states: _containers.RepeatedCompositeFieldContainer[StateValue]
    questions: _containers.RepeatedCompositeFieldContainer[Question]
    model: str
    task: str
    lang: str
    lang_guess: str
    max_len: int
    head_max_len: int
    min_confidence_all: float
    min_confidence_buckets: ConfidenceBuckets
    request_json: str
    include_json: bool
    def __init__(self, states: _Optional[_Iterable[_Union[StateValue, _Mapping]]] = ..., questions: _Optional[_Iterable[_Union[Question, _Mapping]]] = ..., model: _Optional[str] = ..., task: _Optional[str] = ..., lang: _Optional[str] = ..., lang_guess: _Optional[str] = ..., max_len: _Optional[int] = ..., head_max_len: _Optional[int] = ..., min_confidence_all: _Optional[float] = ..., min_confidence_buckets: _Optional[_Union[ConfidenceBuckets, _Mapping]] = ..., request_json: _Optional[str] = ..., include_json: _Optional[bool] = ...) -> None: ...

class TotalUsage(_message.Message):
    __slots__ = ("input_tokens", "output_tokens")
    INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    input_tokens: int
    output_tokens: int
    def __init__(self, input_tokens: _Optional[int] = ..., output_tokens: _Optional[int] = ...) -> None: ...

class DecideBatchResponse(_message.Message):
    __slots__ = ("results", "total_usage", "json", "inference_ms")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_USAGE_FIELD_NUMBER: _ClassVar[int]
    JSON_FIELD_NUMBER: _ClassVar[int]
    INFERENCE_MS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[DecideResponse]
    total_usage: TotalUsage
    json: str
    inference_ms: float
    def __init__(self, results: _Optional[_Iterable[_Union[DecideResponse, _Mapping]]] = ..., total_usage: _Optional[_Union[TotalUsage, _Mapping]] = ..., json: _Optional[str] = ..., inference_ms: _Optional[float] = ...) -> None: ...

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
