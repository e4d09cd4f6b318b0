"""Questions on the tokenizer wire: the rendered texts a caller that already validated sends."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..errors import Kind, LayaError
from ..decisions.questions import QTYPES, Question, parse_questions


def question_from_text(q) -> Question:
    """A rendered question from the wire; only the texts matter for tokenization."""
    if q.type not in QTYPES:
        raise LayaError(Kind.INVALID, "question %r: unknown type %r" % (q.id, q.type))
    order = tuple(q.option_order) if len(q.option_order) else None
    if order is not None and sorted(order) != list(range(len(q.options))):
        raise LayaError(Kind.INVALID, "question %r: option_order must be a permutation of range(%d)"
                        % (q.id, len(q.options)))
    return Question(qid=q.id, type=q.type, qtype=QTYPES[q.type], instructions=q.instructions,
                    options=tuple(q.options), labels=(), legend=None, option_order=order)


def question_to_text(q: Question, msg) -> None:
    msg.id, msg.type, msg.instructions = q.qid, q.type, q.instructions
    msg.options.extend(q.options)
    if q.option_order is not None:
        msg.option_order.extend(q.option_order)


@dataclass(frozen=True)
class StateText:
    """A state as the tokenizer reads it: its text, and whether a cut keeps its end."""
    text: str
    keep_end: bool = False


def state_of(state: Any) -> StateText:
    """A str state as is; anything else `json.dumps(state, ensure_ascii=False)` (default
    separators), as upstream serializes it; a list (a conversation) is cut from the left."""
    if isinstance(state, StateText):
        return state
    if isinstance(state, str):
        return StateText(state)
    return StateText(json.dumps(state, ensure_ascii=False), isinstance(state, list))


def tokenize_request(request_cls, checkpoint: str, states: list, questions: dict):
    """A TokenizeRequest for `states` (any JSON values) and a `/v1/systemone` questions object,
    validated and rendered here (tools and tests; the gateway renders its parsed questions)."""
    req = request_cls(checkpoint=checkpoint)
    for s in map(state_of, states):
        req.states.add(text=s.text, keep_end=s.keep_end)
    for q in parse_questions(questions):
        question_to_text(q, req.questions.add())
    return req
