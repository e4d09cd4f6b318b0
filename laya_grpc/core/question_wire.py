"""Questions on the tokenizer wire: the rendered texts a caller that already validated sends."""
from __future__ import annotations

from .errors import Kind, LayaError
from .questions import QTYPES, Question


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
