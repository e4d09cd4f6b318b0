"""Question validation and normalisation, text for text what upstream laya 0.4.15 does.

Two layers, as upstream has them:
* `check_request_limits` / `check_limits`: `laya serve`'s `_check_request_limits` (400/413 and the
  null score level 422), which run before anything else looks at a question;
* `parse_questions`: `Agent._check_question` then `Agent._to_internal` + `render_options`, run in
  request order, first failure wins, each failure a 422 with upstream's exact ValueError text.

The result is a frozen `Question` holding everything the encoder and decoder read, so neither has to
look at the raw JSON again. Pure Python: no torch, no tokenizer.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional

from ..errors import Kind, LayaError

QTYPES = {"choice": 0, "score": 1, "noul": 2}
_DEFAULT_NOUL_LABELS = {"false": "false", "true": "true"}
_NOUL_LABELS_ERROR = "noul labels must map exactly 'false' and 'true' to distinct non-empty strings"

# `laya serve` 0.4.15 hard limits (serve.py), no environment override except the tournament cap.
MAX_QUESTIONS = 64
MAX_STATE_CHARS = 50000
MAX_CHOICE_OPTIONS = 100
MAX_TOURNAMENT_CHOICE_OPTIONS = 255
MAX_SCORE_LEVELS = 32
MAX_TOTAL_OPTIONS = 512
_STATE_PROBE_VALUES = 64


@dataclass(frozen=True)
class Question:
    """One validated question, normalised the way upstream's `_to_internal` + `render_options` do.

    `options` are in label order; `option_order` (slot s shows option `option_order[s]`) is applied
    by the encoder and undone by the decoder. `labels` are the answer keys: a choice keeps the
    caller's ORIGINAL labels (1, 2.5, True stay that type, JSON turns them into string keys later);
    a score has 0..k-1; a noul (False, True), whose semantic order is always [false, true].
    """
    qid: str
    type: str
    qtype: int
    instructions: str
    options: tuple[str, ...]
    labels: tuple
    legend: Optional[dict]
    option_order: Optional[tuple[int, ...]]


def render_criterion(value: Any) -> str:
    """Strings as is; anything else one-line JSON with `", "` / `": "` separators (upstream's)."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "), default=str)


def resolve_noul_labels(labels: Any = None) -> tuple[str, str]:
    """(false_label, true_label), stripped; ValueError with upstream's text when unusable."""
    if labels is None:
        labels = _DEFAULT_NOUL_LABELS
    if not isinstance(labels, dict) or set(labels) != {"false", "true"}:
        raise ValueError(_NOUL_LABELS_ERROR)
    false_label, true_label = labels["false"], labels["true"]
    if not isinstance(false_label, str) or not isinstance(true_label, str):
        raise ValueError(_NOUL_LABELS_ERROR)
    false_label, true_label = false_label.strip(), true_label.strip()
    if not false_label or not true_label or false_label == true_label:
        raise ValueError(_NOUL_LABELS_ERROR)
    return false_label, true_label


def _option_count(qdef: dict) -> int:
    if qdef.get("type") == "noul":
        return 2
    crit = qdef.get("criteria")
    return len(crit) if isinstance(crit, (dict, list, tuple)) else 0


class FieldError(ValueError):
    """A question's ValueError that knows the field at fault, relative to the question
    ("criteria[2]"; "" for the question itself)."""

    def __init__(self, message: str, field: str = ""):
        super().__init__(message)
        self.field = field


def question_path(qid: Any, field: str = "") -> str:
    """The request path of a question's field: `questions["q"].criteria[2]`."""
    key = json.dumps(qid if isinstance(qid, (str, int)) else str(qid), ensure_ascii=False)
    if len(key) > 200:
        key = key[:200] + '..."'
    return "questions[%s]%s" % (key, "." + field if field else "")


def check_question(qid: Any, qdef: Any) -> None:
    """Upstream `Agent._check_question`, raising ValueError (FieldError) with its exact texts."""
    if qid is None:
        raise FieldError("question id must not be None", "")
    if not isinstance(qid, (str, int)) or (isinstance(qid, str) and not qid.strip()):
        raise FieldError("question id must be a non-empty string, got %r" % (qid,), "")
    if not isinstance(qdef, dict):
        raise FieldError("question %r: definition must be a dict, got %s" % (qid, type(qdef).__name__), "")
    t = qdef.get("type")
    if not isinstance(t, str) or t not in QTYPES:
        raise FieldError("question %r: unknown type %r; use one of %s" % (qid, t, sorted(QTYPES)), "type")
    if "instructions" not in qdef:
        raise FieldError("question %r: no 'instructions'; add the text the model should answer" % (qid,), "instructions")
    ins = qdef["instructions"]
    if ins is None:
        raise FieldError("question %r: 'instructions' must not be None; add the text the model should answer"
                         % (qid,), "instructions")
    if (isinstance(ins, str) and not ins.strip()) or (isinstance(ins, (list, dict)) and not ins):
        raise FieldError("question %r: 'instructions' must not be empty; add the text the model should answer"
                         % (qid,), "instructions")
    if not isinstance(ins, (str, dict, list, int, float)):
        raise FieldError("question %r: 'instructions' must be a string, dict, or list, got %s"
                         % (qid, type(ins).__name__), "instructions")
    crit = qdef.get("criteria")
    if t == "choice":
        _check_choice_criteria(qid, crit)
    elif t == "score":
        if not isinstance(crit, list):
            raise FieldError("question %r: a score question takes 'criteria' as a list of level "
                             "descriptions, index 0 first" % (qid,), "criteria")
        if not crit:
            raise FieldError("question %r: a score question needs at least one level" % (qid,), "criteria")
        if None in crit:
            raise FieldError("question %r: score level %d is null; give every level a description, "
                             "index 0 first" % (qid, crit.index(None)), "criteria[%d]" % crit.index(None))
    elif crit is not None and not isinstance(crit, dict):
        raise FieldError("question %r: a noul question takes 'criteria' as a dict with optional "
                         "'true'/'false' descriptions, or omits it" % (qid,), "criteria")
    elif isinstance(crit, dict):
        keys = {str(k).lower() for k in crit}
        if not keys <= {"true", "false"}:
            raise FieldError(
                "question %r: a noul question takes 'criteria' keyed only 'true'/'false' (either "
                "or both, and omitted is fine), got %s. Those keys are the option texts the model "
                "reads; any other key was silently dropped and replaced with the defaults. If you "
                "want the answer worded differently, keep 'criteria' keyed 'true'/'false' and set "
                "'labels' instead." % (qid, sorted(keys)), "criteria")
    if "option_order" in qdef:
        order = qdef["option_order"]
        n = _option_count(qdef)
        if (not isinstance(order, (list, tuple))
                or len(order) != n
                or sorted(int(i) for i in order if isinstance(i, int) and not isinstance(i, bool)) != list(range(n))):
            raise FieldError(
                "question %r: 'option_order' must be a permutation of range(%d) -- one slot per "
                "option, each option once -- got %r" % (qid, n, order), "option_order")
    if "labels" in qdef:
        if t != "noul":
            raise FieldError("question %r: 'labels' is only supported for noul questions" % (qid,), "labels")
        try:
            resolve_noul_labels(qdef["labels"])
        except ValueError as e:
            raise FieldError("question %r: %s" % (qid, e), "labels") from e


def _check_choice_criteria(qid: Any, crit: Any) -> None:
    if not isinstance(crit, (dict, list)):
        raise FieldError("question %r: a choice question takes 'criteria' as a dict of "
                         "label -> description, or a list of labels" % (qid,), "criteria")
    if not crit:
        raise FieldError("question %r: a choice question needs at least one criterion" % (qid,), "criteria")
    for i, label in enumerate(crit if isinstance(crit, list) else crit.keys()):
        if label is not None and not isinstance(label, (str, int, float, bool)):
            raise FieldError(
                "question %r: choice label %d is a %s; a label is rendered as option text "
                "and used as the answer key, so it must be a scalar (a string, number or "
                "bool), got %r" % (qid, i, type(label).__name__, label), "criteria[%d]" % i)
        if label is None:
            raise FieldError(
                "question %r: choice label %d is null; a label is rendered as option text "
                "and used as the answer key, so it must be a string, number or bool -- a "
                "null label renders as the text \"None\" while its answer key is \"null\""
                % (qid, i), "criteria[%d]" % i)
    if isinstance(crit, list):
        # A Python dict, like upstream's: labels that compare equal (1, 1.0, True) are one key, and
        # identity wins first, so the one NaN object json.loads shares is a repeat of itself.
        seen: dict[Any, int] = {}
        for i, label in enumerate(crit):
            if label in seen:
                raise FieldError(
                    "question %r: choice label %d (%r) repeats label %d; the labels are the "
                    "answer keys, so every option needs its own (1, 1.0 and True are one "
                    "key)" % (qid, i, label, seen[label]), "criteria[%d]" % i)
            seen[label] = i


def _normalise(qid: Any, qdef: dict) -> Question:
    """Upstream `_to_internal` + `render_options` + the decoder's label/legend view, for a checked qdef."""
    t = qdef["type"]
    crit = qdef.get("criteria")
    ins = qdef["instructions"]
    if not isinstance(ins, str):
        ins = json.dumps(ins, ensure_ascii=False)
    order = tuple(int(i) for i in qdef["option_order"]) if "option_order" in qdef else None
    legend = None
    if t == "choice":
        if isinstance(crit, list):
            crit = {c: None for c in crit}
        options = tuple(str(k) if v is None or v == "" else "%s: %s" % (k, render_criterion(v))
                        for k, v in crit.items())
        labels: tuple = tuple(crit.keys())
    elif t == "score":
        options = tuple("level %d: %s" % (i, render_criterion(c)) for i, c in enumerate(crit))
        labels = tuple(range(len(crit)))
        legend = {str(i): render_criterion(c) for i, c in enumerate(crit)}
    else:
        crit = {str(k).lower(): v for k, v in crit.items()} if isinstance(crit, dict) else {}
        false_label, true_label = resolve_noul_labels(qdef.get("labels"))
        false_crit, true_crit = crit.get("false"), crit.get("true")
        options = (
            false_label + ": " + (render_criterion(false_crit) if false_crit not in (None, "")
                                  else "no, the statement does not hold"),
            true_label + ": " + (render_criterion(true_crit) if true_crit not in (None, "")
                                 else "yes, the statement holds"),
        )
        labels = (False, True)
    return Question(qid=qid, type=t, qtype=QTYPES[t], instructions=ins, options=options,
                    labels=labels, legend=legend, option_order=order)


def parse_questions(questions: Any) -> list[Question]:
    """Validate every question (request order, first failure wins), then normalise them all.

    422 (`Kind.INVALID`) with upstream's text for a bad question; 400 when `questions` is not an
    object, as `laya serve` answers. `{}` gives `[]` (upstream answers without tokenising).
    """
    if not isinstance(questions, dict):
        raise LayaError(Kind.BAD_REQUEST, "'questions' must be an object", "questions")
    for qid, qdef in questions.items():
        try:
            check_question(qid, qdef)
        except ValueError as e:
            raise LayaError(Kind.INVALID, str(e), question_path(qid, getattr(e, "field", ""))) from None
    return [_normalise(qid, qdef) for qid, qdef in questions.items()]


def check_limits(questions: Any, max_choice_options: int = MAX_CHOICE_OPTIONS) -> None:
    """The question half of `laya serve`'s `_check_request_limits` (steps 2-5 of its order)."""
    if not isinstance(questions, dict):
        raise LayaError(Kind.BAD_REQUEST, "'questions' must be an object", "questions")
    if len(questions) > MAX_QUESTIONS:
        raise LayaError(Kind.TOO_LARGE, "too many questions (%d > %d)" % (len(questions), MAX_QUESTIONS))
    total_options = 0
    for qid, question in questions.items():
        if not isinstance(question, dict):
            continue
        crit = question.get("criteria")
        qtype = question.get("type")
        if qtype == "choice" and isinstance(crit, (dict, list)):
            count = len(crit)
            total_options += count
            if count > max_choice_options:
                raise LayaError(Kind.TOO_LARGE, "too many choice options for %r (%d > %d)"
                                % (qid, count, max_choice_options))
        elif qtype == "score" and isinstance(crit, list):
            count = len(crit)
            total_options += count
            if count > MAX_SCORE_LEVELS:
                raise LayaError(Kind.TOO_LARGE, "too many score levels for %r (%d > %d)"
                                % (qid, count, MAX_SCORE_LEVELS))
            if None in crit:
                raise LayaError(Kind.INVALID, "score question %r has a null level at index %d; give every "
                                "level a description" % (qid, crit.index(None)),
                                question_path(qid, "criteria[%d]" % crit.index(None)))
    if total_options > MAX_TOTAL_OPTIONS:
        raise LayaError(Kind.TOO_LARGE, "too many answer options across questions (%d > %d)"
                        % (total_options, MAX_TOTAL_OPTIONS))


def _state_length_lower_bound_over(state: Any, cap: int) -> int:
    """Upstream's 64-value fast path: a lower bound on the JSON length once it passes `cap`, else 0."""
    total = 0
    budget = _STATE_PROBE_VALUES
    stack = [state]
    while stack and budget > 0:
        budget -= 1
        item = stack.pop()
        if isinstance(item, str):
            total += len(item)
            if total > cap:
                return total
        elif type(item) is dict:
            stack.extend(item.values())
        elif type(item) is list or type(item) is tuple:
            stack.extend(item)
        else:
            return 0
    return 0


def state_length(state: Any) -> int:
    """The state length `laya serve` compares with MAX_STATE_CHARS (the reported number included)."""
    if isinstance(state, str):
        return len(state)
    over = _state_length_lower_bound_over(state, MAX_STATE_CHARS)
    if over:
        return over
    try:
        return len(json.dumps(state, ensure_ascii=False))
    except (TypeError, ValueError, RecursionError):
        raise LayaError(Kind.BAD_REQUEST, "'state' must be JSON-serializable", "state") from None


def check_request_limits(state: Any, questions: Any, max_choice_options: int = MAX_CHOICE_OPTIONS) -> None:
    """`laya serve`'s `_check_request_limits` for one state, in its order (which decides the winner)."""
    if state is None:
        raise LayaError(Kind.BAD_REQUEST, "'state' is required", "state")
    check_limits(questions, max_choice_options)
    n = state_length(state)
    if n > MAX_STATE_CHARS:
        raise LayaError(Kind.TOO_LARGE, "state too large (%d > %d chars)" % (n, MAX_STATE_CHARS))
