"""One request's answer as typed values, and the `/v1/systemone` JSON objects they render to.

The answer loop builds these, the HTTP front renders `body()` (upstream laya 0.4.15's objects, key
order included: `json.dumps` of them is `laya serve`'s bytes) and the gRPC front packs the same
values into `laya_proto.v1` messages (`laya_grpc.gateway.typed_answer`); the client reads those
messages back into these types (`laya_grpc.client.answers`), so all three speak one model.

A decision renders in one of three forms, as upstream emits them: `Agent.predict`'s (no routing:
the in-process `Predictor`), `laya serve`'s (with `routing`, and `x_jev_confidence` last on every
choice and score answer) and `LAYA_JEV_STRICT`'s projection onto the Jev keys (`strict`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Union

from .confidence_gate import ABSTAINED, PASSED, UNEVALUATED, Threshold, threshold_for
from .routing import Routing

MODEL_TAG = "laya-rl-agent"   # upstream's constant family tag; the checkpoint is in routing.model
STRICT_KEYS = {"choice": ("type", "choice", "confidence", "probabilities"),
               "score": ("type", "score", "confidence", "probabilities", "legend"), "noul": ("type", "noul")}


@dataclass(frozen=True, slots=True)
class Gate:
    """The min_confidence gate's verdict on one answer (`abstention`: passed, abstained, unevaluated)."""
    abstention: str
    threshold: float

    @classmethod
    def of(cls, qtype: str, k: int, answer_confidence: float, confidence: float,
           min_confidence: Optional[Threshold]) -> Optional["Gate"]:
        """Upstream's verdict on an answer of `qtype` with `k` probabilities (its bucket): its
        `answer_confidence` (else `confidence`) against the threshold; None without a threshold."""
        if min_confidence is None:
            return None
        conf = answer_confidence if math.isfinite(answer_confidence) else confidence
        threshold = float(threshold_for(qtype, k, min_confidence))
        return cls(UNEVALUATED if not math.isfinite(conf) else ABSTAINED if conf < threshold else PASSED, threshold)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Answer:
    """The fields every answer type shares, rendered after the type's own."""
    qid: str
    confidence: float
    answer_confidence: float
    act_probability: float
    gate: Optional[Gate] = None
    jev: Optional[float] = None   # laya serve's x_jev_confidence (choice, score); None when it adds none

    def strict_body(self) -> dict:
        """LAYA_JEV_STRICT's projection: the Jev contract's keys, in its order."""
        full = self.body(served=False)
        return {k: full[k] for k in STRICT_KEYS[self.TYPE]}

    def _tail(self, d: dict, served: bool) -> dict:
        d["confidence"], d["answer_confidence"] = self.confidence, self.answer_confidence
        d["action"] = {"act_probability": self.act_probability}
        if self.gate is not None:   # low_confidence (only when abstained) first, as upstream writes them
            if self.gate.abstention == ABSTAINED:
                d["low_confidence"] = True
            d.update(abstention=self.gate.abstention, abstention_threshold=self.gate.threshold)
        if served and self.jev is not None:
            d["x_jev_confidence"] = self.jev
        return d


@dataclass(frozen=True, slots=True, kw_only=True)
class ChoiceAnswer(_Answer):
    TYPE = "choice"
    choice: Any                                  # the caller's label, JSON type kept (1, 2.5, true, "x")
    probabilities: tuple[tuple[Any, float], ...]   # (label, p): the answer's dict items (equal labels merged)

    def body(self, served: bool = True) -> dict:
        return self._tail({"type": "choice", "choice": self.choice, "probabilities": dict(self.probabilities)},
                          served)


@dataclass(frozen=True, slots=True, kw_only=True)
class ScoreAnswer(_Answer):
    TYPE = "score"
    score: float
    legend: tuple[str, ...]            # level i's text
    probabilities: tuple[float, ...]   # level i's probability

    def body(self, served: bool = True) -> dict:
        levels = [str(i) for i in range(len(self.legend))]   # level keys "0", "1", ...
        return self._tail({"type": "score", "score": self.score, "legend": dict(zip(levels, self.legend)),
                           "probabilities": dict(zip(levels, self.probabilities))}, served)


@dataclass(frozen=True, slots=True, kw_only=True)
class NoulAnswer(_Answer):
    TYPE = "noul"
    noul: float

    def body(self, served: bool = True) -> dict:
        return self._tail({"type": "noul", "noul": self.noul}, served)


Answer = Union[ChoiceAnswer, ScoreAnswer, NoulAnswer]


@dataclass(frozen=True, slots=True)
class OptionUsage:
    """A question whose options tokenized to fewer distinct texts than it has."""
    qid: str
    total: int
    distinct: int
    tokens_per_option: Optional[int]


@dataclass(frozen=True, slots=True)
class Usage:
    """Upstream's usage block for one state. `state_tokens` None: no state was tokenized (an empty
    question set) and the block holds the token counts alone."""
    input_tokens: int = 0
    output_tokens: int = 0
    state_tokens: Optional[int] = None
    state_tokens_dropped: int = 0
    truncated: bool = False
    truncated_questions: tuple[str, ...] = ()
    options: tuple[OptionUsage, ...] = ()

    def body(self) -> dict:
        d: dict = {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens}
        if self.state_tokens is not None:
            d.update(state_tokens=self.state_tokens, state_tokens_dropped=self.state_tokens_dropped,
                     truncated=self.truncated, truncated_questions=list(self.truncated_questions))
        if self.options:
            d["options"] = {o.qid: {"total": o.total, "distinct": o.distinct,
                                    "tokens_per_option": o.tokens_per_option} for o in self.options}
        return d

    def to_proto(self, m, strict: bool = False) -> None:
        """Into a `laya_proto.v1.Usage` (`strict`: the token counts alone, as LAYA_JEV_STRICT renders)."""
        m.input_tokens, m.output_tokens = self.input_tokens, self.output_tokens
        if strict:
            return
        if self.state_tokens is not None:
            m.state_tokens, m.state_tokens_dropped, m.truncated = (self.state_tokens, self.state_tokens_dropped,
                                                                   self.truncated)
            m.truncated_questions.extend(self.truncated_questions)
        for o in self.options:
            entry = m.options[o.qid]
            entry.total, entry.distinct = o.total, o.distinct
            if o.tokens_per_option is not None:
                entry.tokens_per_option = o.tokens_per_option

    @classmethod
    def from_proto(cls, m, order=None) -> "Usage":
        """From a `laya_proto.v1.Usage`; `options` in the question ids' `order` when given (a proto
        map keeps no order)."""
        o = m.options
        options = tuple(OptionUsage(k, o[k].total, o[k].distinct,
                                    o[k].tokens_per_option if o[k].HasField("tokens_per_option") else None)
                        for k in (o if order is None else [k for k in order if k in o]))
        state = ((m.state_tokens, m.state_tokens_dropped, m.truncated, tuple(m.truncated_questions))
                 if m.HasField("state_tokens") else (None, 0, False, ()))
        return cls(m.input_tokens, m.output_tokens, *state, options)


@dataclass(frozen=True, slots=True)
class Decision:
    """One state's answers in question order, its usage, and (served) how it was routed."""
    answers: tuple[Answer, ...] = ()
    usage: Usage = Usage()
    routing: Optional[Routing] = None   # set: laya serve's form; None: Agent.predict's
    strict: bool = False                # LAYA_JEV_STRICT: only the Jev contract's keys

    def body(self) -> dict:
        """The `/v1/systemone` response object (an `Agent.predict` result without routing)."""
        if self.strict:
            return {"model": MODEL_TAG, "answers": {a.qid: a.strict_body() for a in self.answers},
                    "usage": {"input_tokens": self.usage.input_tokens, "output_tokens": self.usage.output_tokens}}
        served = self.routing is not None
        d = {"model": MODEL_TAG, "answers": {a.qid: a.body(served) for a in self.answers},
             "usage": self.usage.body()}
        if served:
            d["routing"] = self.routing.block()
        return d


EMPTY = Decision()   # upstream's answer to an empty question set: no tokenization, no forward pass


@dataclass(frozen=True, slots=True)
class BatchDecision:
    """Many states' decisions, in input order."""
    results: tuple[Decision, ...]

    @property
    def total_usage(self) -> tuple[int, int]:
        return (sum(r.usage.input_tokens for r in self.results), sum(r.usage.output_tokens for r in self.results))

    def body(self) -> dict:
        """The `/v1/systemone/batch` response object."""
        i, o = self.total_usage
        return {"results": [r.body() for r in self.results], "total_usage": {"input_tokens": i, "output_tokens": o}}
