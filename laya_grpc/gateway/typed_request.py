"""Typed gRPC requests -> the decoded `/v1/systemone` body, without JSON text in between.

The body then goes through the HTTP route's own checks (`http_body.parse_decide` / `parse_batch`),
so every rule and error text is upstream's. What only the typed form can get wrong (a request
that sets conflicting fields, a label with no value, a criterion that does not fit its question
type) fails here with INVALID_ARGUMENT and the path of the field at fault. JSON text is parsed
only where the value is arbitrary JSON (a structured state, structured instructions) or where
the caller sent the whole body as `request_json`.
"""
from __future__ import annotations

import json
from typing import Any

from laya_grpc.core.errors import Kind, LayaError
from laya_grpc.core.wire.json_labels import label_value
from laya_grpc.core.runtime.logs import clip_repr
from laya_grpc.core.decisions.questions import question_path
from laya_proto.v1 import decision_pb2

from .admission import MAX_BODY_BYTES, TOO_LARGE_DETAIL
from .http_body import may_hold_lone_surrogate, load_json

TYPE_NAMES = {decision_pb2.QUESTION_TYPE_CHOICE: "choice", decision_pb2.QUESTION_TYPE_SCORE: "score",
              decision_pb2.QUESTION_TYPE_NOUL: "noul"}
_TYPE_ENUM_NAMES = ", ".join(decision_pb2.QuestionType.Name(t) for t in TYPE_NAMES)
_SCALAR_CONTROLS = ("model", "task", "lang", "lang_guess", "max_len", "head_max_len")


class Body:
    """A decoded body and whether a lone surrogate can be in it (only a JSON text's `\\u` escape
    makes one: protobuf strings are valid UTF-8)."""
    __slots__ = ("value", "may_hold_surrogate")

    def __init__(self):
        self.value: dict = {}
        self.may_hold_surrogate = False

    def json(self, text: str, field: str) -> Any:
        if "\\u" in text:
            self.may_hold_surrogate = True
        try:
            return json.loads(text)
        except (ValueError, RecursionError) as e:
            raise LayaError(Kind.BAD_REQUEST, "%s is not valid JSON: %s" % (field, e), field) from None


def _capped(req) -> None:
    """The HTTP route's 2 MiB body cap, applied to the typed message's encoded size."""
    if req.ByteSize() > MAX_BODY_BYTES:
        raise LayaError(Kind.TOO_LARGE, TOO_LARGE_DETAIL)


def _request_json(req, route: str) -> Body:
    """The whole body sent as JSON text: nothing else may be set beside it."""
    others = [f.name for f, _ in req.ListFields() if f.name not in ("request_json", "include_json")]
    if others:
        raise LayaError(Kind.BAD_REQUEST, "request_json is the whole %s body; it cannot be combined with %s"
                        % (route, ", ".join(others)), "request_json")
    raw = req.request_json.encode("utf-8")
    if len(raw) > MAX_BODY_BYTES:
        raise LayaError(Kind.TOO_LARGE, TOO_LARGE_DETAIL)
    body = Body()
    body.value = load_json(raw)     # bytes, as the HTTP route reads them (a BOM, UTF-16, ...), its error text too
    body.may_hold_surrogate = may_hold_lone_surrogate(raw)
    return body


def _state(body: Body, state, field: str) -> Any:
    which = state.WhichOneof("value")
    if which == "text":
        return state.text
    if which == "json":
        return body.json(state.json, field + ".json")
    return None


def _label(c, field: str, i: int) -> Any:
    which = c.label.WhichOneof("value")
    if which is None:   # the path is formatted only on this failure (the hot path never builds one)
        return label_value(c.label, "%s.criteria[%d].label" % (field, i))
    return getattr(c.label, which)


def _description(c) -> Any:
    return c.description if c.HasField("description") else None


def _choice_criteria(q, crit, field: str) -> Any:
    labels = [_label(c, field, i) for i, c in enumerate(crit)]
    descriptions = [_description(c) for c in crit]
    if all(d is None for d in descriptions):
        return labels            # the list form: labels only
    out: dict = {}               # the object form: label -> description, labels are strings there
    for i, (label, description) in enumerate(zip(labels, descriptions)):
        path = "%s.criteria[%d].label" % (field, i)
        if not isinstance(label, str):
            raise LayaError(Kind.INVALID, "question %s: a choice criterion with a description takes a "
                                          "string label (the /v1/systemone object form), got %r" % (clip_repr(q.id), label), path)
        if label in out:
            raise LayaError(Kind.INVALID, "question %s: choice label %d (%r) repeats an earlier label; every "
                                          "option needs its own" % (clip_repr(q.id), i, label), path)
        out[label] = description
    return out


def _score_criteria(q, crit, field: str) -> list:
    for i, c in enumerate(crit):
        if c.HasField("label"):
            raise LayaError(Kind.INVALID, "question %s: a score level has no label (its label is its index); "
                                          "put the level's text in description" % (clip_repr(q.id),),
                            "%s.criteria[%d].label" % (field, i))
    return [_description(c) for c in crit]


def _noul_criteria(q, crit, field: str) -> dict:
    out: dict = {}
    for i, c in enumerate(crit):
        label = _label(c, field, i)
        key = "true" if label is True else "false" if label is False else None
        if key is None or key in out:
            raise LayaError(Kind.INVALID, "question %s: a noul question takes at most one criterion labelled "
                                          "bool_value true and one labelled false" % (clip_repr(q.id),),
                            "%s.criteria[%d].label" % (field, i))
        out[key] = _description(c)
    return out


_CRITERIA = {"choice": _choice_criteria, "score": _score_criteria, "noul": _noul_criteria}


def _type(q) -> str:
    """The question's type name; an unset or unknown enum value is refused with the proto's names."""
    t = TYPE_NAMES.get(q.type)
    if t is None:
        what = "has no type" if q.type == decision_pb2.QUESTION_TYPE_UNSPECIFIED else "has unknown type %d" % q.type
        raise LayaError(Kind.INVALID, "question %s %s; use one of %s" % (clip_repr(q.id), what, _TYPE_ENUM_NAMES),
                        question_path(q.id, "type"))
    return t


def _questions(body: Body, questions) -> dict:
    out: dict = {}
    for i, q in enumerate(questions):
        qid = q.id
        if qid in out:
            raise LayaError(Kind.INVALID, "question id %s is given twice" % clip_repr(qid), "questions[%d].id" % i)
        path = question_path(qid)
        d: dict = {"type": _type(q)}
        t = d["type"]
        which = q.WhichOneof("instructions")
        if which == "instructions_text":
            d["instructions"] = q.instructions_text
        elif which == "instructions_json":
            d["instructions"] = body.json(q.instructions_json, path + ".instructions_json")
        crit = q.criteria
        if crit:
            d["criteria"] = _CRITERIA[t](q, crit, path)
        if q.HasField("labels"):
            d["labels"] = {"false": q.labels.false_label, "true": q.labels.true_label}
        order = q.option_order
        if order:
            d["option_order"] = list(order)
        out[qid] = d
    return out


def _controls(body: Body, req) -> None:
    value = body.value
    for f, v in req.ListFields():     # only what is set; the typed fields keep their names in the body
        if f.name in _SCALAR_CONTROLS:
            value[f.name] = v
    which = req.WhichOneof("min_confidence")
    if which == "min_confidence_all":
        value["min_confidence"] = req.min_confidence_all
    elif which == "min_confidence_buckets":
        value["min_confidence"] = dict(req.min_confidence_buckets.thresholds)


def decide_body(req: decision_pb2.DecideRequest) -> Body:
    """A DecideRequest -> the /v1/systemone body it stands for."""
    if req.request_json:
        return _request_json(req, "/v1/systemone")
    _capped(req)
    body = Body()
    if req.HasField("state"):
        body.value["state"] = _state(body, req.state, "state")
    body.value["questions"] = _questions(body, req.questions)
    _controls(body, req)
    return body


def batch_body(req: decision_pb2.DecideBatchRequest) -> Body:
    """A DecideBatchRequest -> the /v1/systemone/batch body it stands for."""
    if req.request_json:
        return _request_json(req, "/v1/systemone/batch")
    _capped(req)
    body = Body()
    body.value["states"] = [_state(body, s, "states[%d]" % i) for i, s in enumerate(req.states)]
    body.value["questions"] = _questions(body, req.questions)
    _controls(body, req)
    return body
