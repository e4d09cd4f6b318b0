"""Typed DecideResponse -> the dict `/v1/systemone` answers with (equal to the HTTP body's parsed
JSON, key order included except inside map fields), so code written against the HTTP API ports
as is. The inverse of `laya_grpc.gateway.typed_answer`.
"""
from __future__ import annotations

from typing import Any

from laya_grpc.core.json_labels import json_key, label_value
from laya_grpc.core.question_wire import usage_from_proto
from laya_proto.v1 import decision_pb2

TYPE_NAMES = {decision_pb2.QUESTION_TYPE_CHOICE: "choice", decision_pb2.QUESTION_TYPE_SCORE: "score",
              decision_pb2.QUESTION_TYPE_NOUL: "noul"}
ABSTENTION_NAMES = {decision_pb2.ABSTENTION_PASSED: "passed", decision_pb2.ABSTENTION_ABSTAINED: "abstained",
                    decision_pb2.ABSTENTION_UNEVALUATED: "unevaluated"}


def _choice_probabilities(c) -> dict:
    # json.loads of upstream's body: labels 1 and "1" are one key there (first place, last value)
    return {json_key(label_value(lp.label)): lp.probability for lp in c.probabilities}


def _levels(values) -> dict:
    return {str(i): v for i, v in enumerate(values)}


def answer_dict(m) -> dict[str, Any]:
    """One typed Answer as the HTTP answer object."""
    which = m.WhichOneof("answer")
    d: dict[str, Any] = {"type": TYPE_NAMES[m.type]}
    if not m.HasField("answer_confidence"):       # LAYA_JEV_STRICT: only the Jev keys, in its order
        if which == "choice":
            d.update(choice=label_value(m.choice.choice), confidence=m.confidence,
                     probabilities=_choice_probabilities(m.choice))
        elif which == "score":
            d.update(score=m.score.score, confidence=m.confidence,
                     probabilities=_levels(m.score.probabilities), legend=_levels(m.score.legend))
        else:
            d["noul"] = m.noul.noul
        return d
    jev = None
    if which == "choice":
        d["choice"] = label_value(m.choice.choice)
        d["probabilities"] = _choice_probabilities(m.choice)
        jev = m.choice.x_jev_confidence if m.choice.HasField("x_jev_confidence") else None
    elif which == "score":
        d["score"] = m.score.score
        d["legend"] = _levels(m.score.legend)
        d["probabilities"] = _levels(m.score.probabilities)
        jev = m.score.x_jev_confidence if m.score.HasField("x_jev_confidence") else None
    else:
        d["noul"] = m.noul.noul
    if m.HasField("confidence"):
        d["confidence"] = m.confidence
    d["answer_confidence"] = m.answer_confidence
    if m.HasField("action"):
        d["action"] = {"act_probability": m.action.act_probability}
    if m.HasField("low_confidence"):
        d["low_confidence"] = m.low_confidence
    if m.abstention:
        d["abstention"] = ABSTENTION_NAMES[m.abstention]
        d["abstention_threshold"] = m.abstention_threshold
    if jev is not None:
        d["x_jev_confidence"] = jev
    return d


def _detection(m) -> dict[str, Any]:
    return {"script": m.script, "script_profile": dict(m.script_profile),
            "language": m.language if m.HasField("language") else None,
            "is_english": m.is_english, "language_undecided": m.language_undecided,
            "diacritic_rate": m.diacritic_rate, "non_latin_fraction": m.non_latin_fraction,
            "mixed_segment": m.mixed_segment if m.HasField("mixed_segment") else None}


def _routing(r) -> dict[str, Any]:
    return {"model": r.model, "repo": r.repo if r.HasField("repo") else None, "reason": r.reason,
            "detection": _detection(r.detection) if r.HasField("detection") else None,
            "workflow": r.workflow if r.HasField("workflow") else None}


def response_dict(msg: decision_pb2.DecideResponse) -> dict[str, Any]:
    """A typed DecideResponse as the /v1/systemone response object."""
    d: dict[str, Any] = {"model": msg.model, "answers": {a.id: answer_dict(a) for a in msg.answers},
                         "usage": usage_from_proto(msg.usage)}
    if msg.HasField("routing"):
        d["routing"] = _routing(msg.routing)
    return d


def batch_dict(msg: decision_pb2.DecideBatchResponse) -> dict[str, Any]:
    """A typed DecideBatchResponse as the /v1/systemone/batch response object."""
    return {"results": [response_dict(r) for r in msg.results],
            "total_usage": {"input_tokens": msg.total_usage.input_tokens,
                            "output_tokens": msg.total_usage.output_tokens}}
