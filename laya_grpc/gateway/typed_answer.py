"""The engine's typed answers (`laya_grpc.core.decisions.answers`) -> DecideResponse messages, without JSON.

Each value the HTTP answer renders lands in its typed field, and a field the HTTP answer leaves out
stays unset (LAYA_JEV_STRICT answers, an empty question set, a route without detection). A
non-finite number, which makes the HTTP route answer 422 when it renders, fails here the same way.
`laya_grpc.client.answers` reads the messages back into the same types, and the contract tests
check that what it renders equals the HTTP body.
"""
from __future__ import annotations

from typing import Any

from laya_grpc.core.decisions.answers import MODEL_TAG, BatchDecision, ChoiceAnswer, Decision, NoulAnswer, ScoreAnswer
from laya_grpc.core.decisions.confidence_gate import ABSTAINED, PASSED, UNEVALUATED
from laya_grpc.core.errors import Kind, LayaError
from laya_grpc.core.wire.json_labels import set_label
from laya_grpc.core.decisions.routing import Routing
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


def _answer(a, strict: bool, m) -> None:
    """One answer; `strict` packs only what the Jev projection renders."""
    m.id, m.type = a.qid, QUESTION_TYPES[a.TYPE]
    if isinstance(a, ChoiceAnswer):
        c = m.choice
        _label(c.choice, a.choice)
        for label, p in a.probabilities:
            _label(c.probabilities.add(probability=_finite(p)).label, label)
    elif isinstance(a, ScoreAnswer):
        s = m.score
        s.score = _finite(a.score)
        s.legend.extend(a.legend)
        s.probabilities.extend(_finite(p) for p in a.probabilities)
    else:
        m.noul.noul = _finite(a.noul)
    if strict:   # the Jev projection: a choice's or a score's confidence, nothing more
        if not isinstance(a, NoulAnswer):
            m.confidence = _finite(a.confidence)
        return
    if a.jev is not None:   # choice and score only
        getattr(m, a.TYPE).x_jev_confidence = a.jev
    m.confidence = _finite(a.confidence)
    m.answer_confidence = _finite(a.answer_confidence)
    m.action.act_probability = _finite(a.act_probability)
    if a.gate is not None:
        if a.gate.abstention == ABSTAINED:
            m.low_confidence = True
        m.abstention, m.abstention_threshold = ABSTENTIONS[a.gate.abstention], a.gate.threshold


def _routing(r: Routing, m) -> None:
    m.model, m.reason = r.model, r.reason
    if r.repo is not None:
        m.repo = r.repo
    if r.detection is not None:   # langdetect's dict: its keys are the Detection fields (None: unset)
        m.detection.script_profile.update(r.detection["script_profile"])
        for key, value in r.detection.items():
            if value is not None and key != "script_profile":
                setattr(m.detection, key, value)
    if r.workflow is not None:
        m.workflow = r.workflow


def pack_decision(d: Decision, msg: decision_pb2.DecideResponse) -> None:
    """One decision into `msg` (answers in question order)."""
    msg.model = MODEL_TAG
    for a in d.answers:
        _answer(a, d.strict, msg.answers.add())
    d.usage.to_proto(msg.usage, d.strict)
    if d.routing is not None and not d.strict:
        _routing(d.routing, msg.routing)


def pack_batch(b: BatchDecision, msg: decision_pb2.DecideBatchResponse) -> None:
    for r in b.results:
        pack_decision(r, msg.results.add())
    msg.total_usage.input_tokens, msg.total_usage.output_tokens = b.total_usage
