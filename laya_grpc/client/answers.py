"""Typed DecideResponse -> the engine's answer types (`laya_grpc.core.decisions.answers`) -> the dict
`/v1/systemone` answers with (equal to the HTTP body's parsed JSON, key order included except inside
map fields), so code written against the HTTP API ports as is. The inverse of
`laya_grpc.gateway.typed_answer`.
"""
from __future__ import annotations

from typing import Any

from laya_grpc.core.decisions.answers import BatchDecision, ChoiceAnswer, Decision, Gate, NoulAnswer, ScoreAnswer, Usage
from laya_grpc.core.wire.json_labels import json_key, label_value
from laya_grpc.core.decisions.routing import Routing
from laya_proto.v1 import decision_pb2

ABSTENTION_NAMES = {decision_pb2.ABSTENTION_PASSED: "passed", decision_pb2.ABSTENTION_ABSTAINED: "abstained",
                    decision_pb2.ABSTENTION_UNEVALUATED: "unevaluated"}


def answer_of(m):
    """One typed Answer message as the engine's answer. A Jev-strict one (no `answer_confidence`)
    carries only the Jev keys; the others read 0 and are not rendered."""
    which = m.WhichOneof("answer")
    common = {"qid": m.id, "confidence": m.confidence, "answer_confidence": m.answer_confidence,
              "act_probability": m.action.act_probability,
              "gate": Gate(ABSTENTION_NAMES[m.abstention], m.abstention_threshold) if m.abstention else None}
    if which == "choice":
        c = m.choice
        # json.loads of upstream's body: labels 1 and "1" are one key there (first place, last value)
        return ChoiceAnswer(choice=label_value(c.choice), **common,
                            probabilities=tuple({json_key(label_value(lp.label)): lp.probability
                                                 for lp in c.probabilities}.items()),
                            jev=c.x_jev_confidence if c.HasField("x_jev_confidence") else None)
    if which == "score":
        s = m.score
        return ScoreAnswer(score=s.score, legend=tuple(s.legend), probabilities=tuple(s.probabilities), **common,
                           jev=s.x_jev_confidence if s.HasField("x_jev_confidence") else None)
    return NoulAnswer(noul=m.noul.noul, **common)


def _routing(r) -> Routing:
    d = r.detection
    detection = {"script": d.script, "script_profile": dict(d.script_profile),
                 "language": d.language if d.HasField("language") else None,
                 "is_english": d.is_english, "language_undecided": d.language_undecided,
                 "diacritic_rate": d.diacritic_rate, "non_latin_fraction": d.non_latin_fraction,
                 "mixed_segment": d.mixed_segment if d.HasField("mixed_segment") else None}
    return Routing(model=r.model, repo=r.repo if r.HasField("repo") else None, reason=r.reason,
                   detection=detection if r.HasField("detection") else None,
                   workflow=r.workflow if r.HasField("workflow") else None)


def decision_of(msg: decision_pb2.DecideResponse) -> Decision:
    """A typed DecideResponse as the engine's Decision (Jev-strict when its answers say so)."""
    return Decision(tuple(answer_of(a) for a in msg.answers), Usage.from_proto(msg.usage),
                    _routing(msg.routing) if msg.HasField("routing") else None,
                    strict=any(not a.HasField("answer_confidence") for a in msg.answers))


def response_dict(msg: decision_pb2.DecideResponse) -> dict[str, Any]:
    """A typed DecideResponse as the /v1/systemone response object."""
    return decision_of(msg).body()


def batch_dict(msg: decision_pb2.DecideBatchResponse) -> dict[str, Any]:
    """A typed DecideBatchResponse as the /v1/systemone/batch response object."""
    return BatchDecision(tuple(decision_of(r) for r in msg.results)).body()
