"""What the engine answers: one state or a batch of states, one validated question set, the
call's controls. The fronts build these from an HTTP body (gateway/http_body.py) or a `Decide`
message (gateway/typed_request.py)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from laya_grpc.core.decisions.confidence_gate import Threshold
from laya_grpc.core.decisions.questions import Question


@dataclass
class Controls:
    """The per-call controls shared by both routes, validated."""
    model: Optional[str] = None          # canonical checkpoint name, None = auto-route
    task: Optional[Any] = None           # raw `task` (routing.reason echoes it), already validated
    lang: Optional[str] = None
    lang_guess: Optional[str] = None
    max_len: Optional[int] = None
    head_max_len: Optional[int] = None
    min_confidence: Optional[Threshold] = None
    unknown_model: Optional[str] = None  # a `model` this server does not know, auto-routed (said in a header)


@dataclass
class DecideRequest:
    state: Any                           # str, dict, list, number or bool (never None)
    questions: list[Question]            # validated, in request order
    raw_questions: dict[str, Any]        # the body's `questions` (ids drive workflow routing)
    controls: Controls = field(default_factory=Controls)


@dataclass
class BatchRequest:
    states: list[Any]
    questions: list[Question]
    raw_questions: dict[str, Any]
    controls: Controls = field(default_factory=Controls)
    batch_size: Optional[int] = None     # caller's cap on states per pass (validated, advisory)
    sort_by_length: bool = False


# -- body ---------------------------------------------------------------------------------------
