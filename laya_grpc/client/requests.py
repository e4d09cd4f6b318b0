"""Plain Python values (the /v1/systemone body's `state`, `questions` and controls) -> typed
DecideRequest / DecideBatchRequest.

Everything the typed contract can say travels typed. A body it cannot say exactly (a structured
criterion description, a non-string label with a description, an integer min_confidence whose
error text would read differently, a batch-only control such as `batch_size`, or input that is
simply invalid) is sent whole as `request_json` instead, so the gateway answers it exactly as the
HTTP route would, error texts included.
"""
from __future__ import annotations

import json
from typing import Any

from laya_grpc.core.wire.json_labels import INT64_MAX, INT64_MIN
from laya_proto.v1 import decision_pb2

QUESTION_TYPES = {"choice": decision_pb2.QUESTION_TYPE_CHOICE, "score": decision_pb2.QUESTION_TYPE_SCORE,
                  "noul": decision_pb2.QUESTION_TYPE_NOUL}
_QUESTION_KEYS = frozenset(("type", "instructions", "criteria", "labels", "option_order"))
_STRING_CONTROLS = ("model", "task", "lang", "lang_guess")
_BUDGET_CONTROLS = ("max_len", "head_max_len")
UINT32_MAX = (1 << 32) - 1


class Untyped(Exception):
    """The body has something the typed contract cannot carry exactly."""


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _label(msg, v: Any) -> None:
    if isinstance(v, str):
        msg.string_value = v
    elif isinstance(v, bool):
        msg.bool_value = v
    elif isinstance(v, int) and INT64_MIN <= v <= INT64_MAX:
        msg.int_value = v
    elif isinstance(v, float):
        msg.number_value = v
    else:
        raise Untyped


def _description(c, v: Any) -> None:
    if v is not None:
        if not isinstance(v, str):
            raise Untyped
        c.description = v


def _question(msg, qid: Any, q: Any) -> None:
    if not isinstance(qid, str) or not isinstance(q, dict) or not set(q) <= _QUESTION_KEYS:
        raise Untyped
    t = q.get("type")
    if t not in QUESTION_TYPES:
        raise Untyped
    msg.id, msg.type = qid, QUESTION_TYPES[t]
    ins = q.get("instructions")
    if isinstance(ins, str):
        msg.instructions_text = ins
    elif isinstance(ins, (dict, list, int, float)) and not isinstance(ins, bool):
        msg.instructions_json = json.dumps(ins, ensure_ascii=False)
    else:
        raise Untyped
    crit = q.get("criteria")
    if t == "choice" and isinstance(crit, list) and crit:
        for label in crit:
            _label(msg.criteria.add().label, label)
    elif t == "choice" and isinstance(crit, dict) and crit and all(isinstance(k, str) for k in crit):
        for label, desc in crit.items():
            c = msg.criteria.add()
            _label(c.label, label)
            _description(c, desc)
    elif t == "score" and isinstance(crit, list) and crit:
        for desc in crit:
            if desc is None:
                raise Untyped
            _description(msg.criteria.add(), desc)
    elif t == "noul" and isinstance(crit, dict):
        keys = [str(k).lower() for k in crit]
        if not set(keys) <= {"true", "false"} or len(set(keys)) != len(keys):
            raise Untyped
        for key, desc in zip(keys, crit.values()):
            c = msg.criteria.add()
            c.label.bool_value = key == "true"
            _description(c, desc)
    elif not (t == "noul" and crit is None):
        raise Untyped
    if "labels" in q:
        labels = q["labels"]
        if (not isinstance(labels, dict) or set(labels) != {"false", "true"}
                or not all(isinstance(v, str) for v in labels.values())):
            raise Untyped
        msg.labels.false_label, msg.labels.true_label = labels["false"], labels["true"]
    if "option_order" in q:
        order = q["option_order"]
        if not isinstance(order, list) or not order or not all(_is_int(i) and 0 <= i <= UINT32_MAX for i in order):
            raise Untyped
        msg.option_order.extend(order)


def _state(msg, state: Any) -> None:
    if isinstance(state, str):
        msg.text = state
    elif state is None:
        raise Untyped
    else:
        msg.json = json.dumps(state, ensure_ascii=False)


def _fill(req, questions: Any, controls: dict) -> None:
    if not isinstance(questions, dict):
        raise Untyped
    for qid, q in questions.items():
        _question(req.questions.add(), qid, q)
    for name, value in controls.items():
        if value is None:
            continue
        if name in _STRING_CONTROLS and isinstance(value, str):
            setattr(req, name, value)
        elif name in _BUDGET_CONTROLS and _is_int(value) and 0 <= value <= UINT32_MAX:
            setattr(req, name, value)
        elif name == "min_confidence" and isinstance(value, float):
            req.min_confidence_all = value
        elif (name == "min_confidence" and isinstance(value, dict) and value
              and all(isinstance(k, str) and isinstance(v, float) for k, v in value.items())):
            req.min_confidence_buckets.thresholds.update(value)
        else:
            raise Untyped


def _body(head: dict, controls: dict) -> str:
    """The body as JSON text, ASCII-escaped so that any str (a lone surrogate too) travels and the
    gateway answers it as the HTTP route does."""
    head.update({k: v for k, v in controls.items() if v is not None})
    return json.dumps(head, allow_nan=True)


def build_decide(state: Any, questions: Any, include_json: bool = False, **controls) -> decision_pb2.DecideRequest:
    """The typed DecideRequest for a /v1/systemone body (request_json when it cannot be typed)."""
    req = decision_pb2.DecideRequest(include_json=include_json)
    try:
        _state(req.state, state)
        _fill(req, questions, controls)
    except (Untyped, ValueError):   # ValueError: a str protobuf cannot carry (a lone surrogate)
        return decision_pb2.DecideRequest(request_json=_body({"state": state, "questions": questions}, controls),
                                          include_json=include_json)
    return req


def build_batch(states: Any, questions: Any, include_json: bool = False,
                **controls) -> decision_pb2.DecideBatchRequest:
    """The typed DecideBatchRequest for a /v1/systemone/batch body (request_json when it cannot be typed)."""
    req = decision_pb2.DecideBatchRequest(include_json=include_json)
    try:
        if not isinstance(states, list) or not states:
            raise Untyped
        for state in states:
            _state(req.states.add(), state)
        _fill(req, questions, controls)
    except (Untyped, ValueError):
        return decision_pb2.DecideBatchRequest(
            request_json=_body({"states": states, "questions": questions}, controls), include_json=include_json)
    return req

