"""Decider result dicts -> typed DecideResponse messages, without rendering JSON.

The result dict is what `/v1/systemone` renders; each of its fields lands in its typed field,
and a field the HTTP answer leaves out stays unset (LAYA_JEV_STRICT answers, an empty question
set, a route without detection). A non-finite number, which makes the HTTP route answer 422 when
it renders, fails here the same way. `laya_grpc.client.answers` is the inverse (typed -> the
HTTP dict), and the contract tests check the round trip equals the HTTP body.
"""
from __future__ import annotations

from typing import Any

from laya_grpc.core.confidence_gate import ABSTAINED, PASSED, UNEVALUATED
from laya_grpc.core.errors import Kind, LayaError
from laya_grpc.core.json_labels import set_label
from laya_grpc.core.question_wire import usage_to_proto
from laya_proto.v1 import decision_pb2

from .render import NAN_DETAIL

QUESTION_TYPES = {"choice": decision_pb2.QUESTION_TYPE_CHOICE, "score": decision_pb2.QUESTION_TYPE_SCORE,
                  "noul": decision_pb2.QUESTION_TYPE_NOUL}
ABSTENTIONS = {PASSED: decision_pb2.ABSTENTION_PASSED, ABSTAINED: decision_pb2.ABSTENTION_ABSTAINED,
               UNEVALUATED: decision_pb2.ABSTENTION_UNEVALUATED}


def _finite(x: float) -> float:
    if x - x != 0:   # NaN or +-Infinity: upstream's renderer refuses it (422)
        raise LayaError(Kind.INVALID, NAN_DETAIL)
    return x


def _label(msg, value: Any) -> None:
    if isinstance(value, float):
        _finite(value)
    set_label(msg, value, "questions")


def _answer(qid: str, a: dict, m) -> None:
    m.id = qid
    t = a["type"]
    m.type = QUESTION_TYPES[t]
    if t == "choice":
        c = m.choice
        _label(c.choice, a["choice"])
        for label, p in a["probabilities"].items():
            lp = c.probabilities.add(probability=_finite(p))
            _label(lp.label, label)
        if "x_jev_confidence" in a:
            c.x_jev_confidence = a["x_jev_confidence"]
    elif t == "score":
        s = m.score
        s.score = _finite(a["score"])
        s.legend.extend(a["legend"].values())
        s.probabilities.extend(_finite(p) for p in a["probabilities"].values())
        if "x_jev_confidence" in a:
            s.x_jev_confidence = a["x_jev_confidence"]
    else:
        m.noul.noul = _finite(a["noul"])
    if "confidence" in a:
        m.confidence = _finite(a["confidence"])
    if "answer_confidence" in a:
        m.answer_confidence = _finite(a["answer_confidence"])
    if "action" in a:
        m.action.act_probability = _finite(a["action"]["act_probability"])
    if "low_confidence" in a:
        m.low_confidence = a["low_confidence"]
    if "abstention" in a:
        m.abstention = ABSTENTIONS[a["abstention"]]
        m.abstention_threshold = a["abstention_threshold"]


def _detection(d: dict, m) -> None:
    m.script = d["script"]
    for k, v in d["script_profile"].items():
        m.script_profile[k] = v
    if d.get("language") is not None:
        m.language = d["language"]
    m.is_english, m.language_undecided = d["is_english"], d["language_undecided"]
    m.diacritic_rate, m.non_latin_fraction = d["diacritic_rate"], d["non_latin_fraction"]
    if d.get("mixed_segment") is not None:
        m.mixed_segment = d["mixed_segment"]


def _routing(r: dict, m) -> None:
    m.model, m.reason = r["model"], r["reason"]
    if r.get("repo") is not None:
        m.repo = r["repo"]
    if r.get("detection") is not None:
        _detection(r["detection"], m.detection)
    if r.get("workflow") is not None:
        m.workflow = r["workflow"]


def pack_result(result: dict, msg: decision_pb2.DecideResponse) -> None:
    """One /v1/systemone result dict into `msg` (answers in question order)."""
    msg.model = result["model"]
    answers = msg.answers
    for qid, a in result["answers"].items():
        _answer(qid, a, answers.add())
    usage_to_proto(result.get("usage") or {}, msg.usage)
    if result.get("routing") is not None:
        _routing(result["routing"], msg.routing)
