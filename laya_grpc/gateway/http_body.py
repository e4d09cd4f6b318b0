"""`/v1/systemone` and `/v1/systemone/batch` bodies -> typed requests, with upstream's exact errors.

Every check of `laya serve` 0.4.15 (`laya/serve.py`, `_systemone_inner`) runs here, in upstream's
order, because the order decides which error a body with several problems gets:

  JSON parse (400) -> object with `questions` [and `states`] (400) -> request limits (400/413/422:
  state, questions type, 64 questions, per-question option caps, null score level, 512 options,
  50 000-char state) -> refused hook fields (422) [-> batch `diagnostics` (422)] -> lone
  surrogate (400) -> `model` (422) -> `max_len`, `head_max_len` (422) -> `lang`, `lang_guess` (422)
  -> `min_confidence` (422) [-> batch `batch_size`, `sort_by_length` (422)] -> `task` (422, what
  routing raises first) -> question validation (422, what the agent raises next).

The last two are routing/agent errors upstream, but neither depends on the state or the model
output, so raising them here gives the same answer and lets the decider start from valid input.
Each failure is `LayaError(kind, upstream's detail)`.
"""
from __future__ import annotations

import json
from typing import Any, Optional

from laya_grpc.core.decisions.confidence_gate import check_min_confidence
from laya_grpc.core.decisions.controls import LONE_SURROGATE_DETAIL, has_lone_surrogate, token_budget
from laya_grpc.core.errors import Kind, LayaError
from laya_grpc.core.decisions.questions import check_request_limits, parse_questions
from laya_grpc.core.decisions.routing import RouteTable, check_language_param, resolve_model_named
from laya_grpc.engine.requests import BatchRequest, Controls, DecideRequest

MAX_BATCH_STATES = 64

BODY_REFUSALS = ("hooks", "on_predict_start", "on_predict_end", "hooks_raise", "hooks_timeout")
BATCH_OUT_PARAMETERS = ("diagnostics",)


# -- body ---------------------------------------------------------------------------------------
def may_hold_lone_surrogate(raw: bytes) -> bool:
    """False when json.loads(raw) cannot produce a surrogate: ASCII with no NUL bytes decodes as
    UTF-8 (no BOM, no UTF-16/32 pattern), so only a \\u escape could make one."""
    return not raw.isascii() or b"\\u" in raw or b"\x00" in raw


def load_json(raw: bytes) -> Any:
    """`json.loads(bytes)`: BOM/UTF-16/UTF-32 detection, NaN/Infinity literals, last duplicate wins."""
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        raise LayaError(Kind.BAD_REQUEST, "request body must be valid JSON") from None


# -- refusals -----------------------------------------------------------------------------------
def _refuse(body: dict, keys: tuple[str, ...], text: str) -> None:
    given = sorted(key for key in keys if body.get(key) is not None)
    if given:
        raise LayaError(Kind.INVALID, text % ", ".join(given), given[0])




# -- controls -----------------------------------------------------------------------------------
def _batch_size(body: dict) -> Optional[int]:
    val = body.get("batch_size")
    if val is None:
        return None
    if not isinstance(val, int) or isinstance(val, bool):
        raise LayaError(Kind.INVALID, "batch_size must be an integer", "batch_size")
    if val < 1:
        raise LayaError(Kind.INVALID, "batch_size must be a positive integer, got %r" % (val,), "batch_size")
    return val


def _sort_by_length(body: dict) -> bool:
    val = body.get("sort_by_length")
    if val is None:
        return False
    if not isinstance(val, bool):
        raise LayaError(Kind.INVALID, "sort_by_length must be a boolean", "sort_by_length")
    return val


def _check_task(task: Any, model: Optional[str], table: RouteTable) -> None:
    """The error routing raises for an unknown `task` (only consulted when no model is pinned)."""
    if task is None or model is not None:
        return
    try:
        table.resolve("typed-decisions" if str(task).lower().replace("-", "_") == "typed_decisions" else task)
    except LayaError as e:
        raise LayaError(e.kind, e.detail, "task") from None


# -- entry points -------------------------------------------------------------------------------
def parse_decide_body(raw: bytes, table: RouteTable, max_token_budget: int = 8192) -> DecideRequest:
    """A `/v1/systemone` body -> DecideRequest, or LayaError with upstream's status and detail."""
    return parse_decide(load_json(raw), table, max_token_budget, may_hold_lone_surrogate(raw))


def parse_decide(body: Any, table: RouteTable, max_token_budget: int = 8192,
                 may_hold_surrogate: bool = True) -> DecideRequest:
    """A `/v1/systemone` body already decoded (the typed gRPC request builds one without JSON
    text); `may_hold_surrogate` False skips the lone-surrogate scan when none can be in it."""
    if not isinstance(body, dict) or "questions" not in body:
        raise LayaError(Kind.BAD_REQUEST, "request body must be an object with a 'questions' field")
    state, questions = body.get("state"), body["questions"]
    check_request_limits(state, questions)
    _refuse(body, BODY_REFUSALS, "%s run inside the server process and cannot be sent to this "
                                 "endpoint; install them where laya-serve runs, or drop them")
    if may_hold_surrogate and has_lone_surrogate(body):
        raise LayaError(Kind.BAD_REQUEST, LONE_SURROGATE_DETAIL)
    controls = _controls(body, table, max_token_budget)
    _check_task(controls.task, controls.model, table)
    return DecideRequest(state=state, questions=parse_questions(questions), raw_questions=questions,
                         controls=controls)


def parse_batch_body(raw: bytes, table: RouteTable, max_token_budget: int = 8192) -> BatchRequest:
    """A `/v1/systemone/batch` body -> BatchRequest, or LayaError with upstream's status and detail."""
    return parse_batch(load_json(raw), table, max_token_budget, may_hold_lone_surrogate(raw))


def parse_batch(body: Any, table: RouteTable, max_token_budget: int = 8192,
                may_hold_surrogate: bool = True) -> BatchRequest:
    """A `/v1/systemone/batch` body already decoded (see `parse_decide`)."""
    if not isinstance(body, dict) or "questions" not in body or "states" not in body:
        raise LayaError(Kind.BAD_REQUEST, "request body must be an object with 'states' and 'questions' fields")
    states, questions = body["states"], body["questions"]
    if not isinstance(states, list) or not states:
        raise LayaError(Kind.BAD_REQUEST, "'states' must be a non-empty list", "states")
    if len(states) > MAX_BATCH_STATES:
        raise LayaError(Kind.TOO_LARGE, "too many states in batch (%d > %d)" % (len(states), MAX_BATCH_STATES))
    for state in states:
        check_request_limits(state, questions)
    _refuse(body, BODY_REFUSALS, "%s run inside the server process and cannot be sent to this "
                                 "endpoint; install them where laya-serve runs, or drop them")
    _refuse(body, BATCH_OUT_PARAMETERS, "%s is filled in place for an in-process caller and cannot be "
                                        "returned over HTTP; read the per-group report from the CLI or a "
                                        "local Router")
    if may_hold_surrogate and has_lone_surrogate(body):
        raise LayaError(Kind.BAD_REQUEST, LONE_SURROGATE_DETAIL)
    controls = _controls(body, table, max_token_budget)
    batch_size = _batch_size(body)
    sort_by_length = _sort_by_length(body)
    _check_task(controls.task, controls.model, table)
    return BatchRequest(states=states, questions=parse_questions(questions), raw_questions=questions,
                        controls=controls, batch_size=batch_size, sort_by_length=sort_by_length)


def _controls(body: dict, table: RouteTable, max_token_budget: int) -> Controls:
    model, unknown_model = resolve_model_named(body.get("model"), table)
    max_len = token_budget(body, "max_len", max_token_budget)
    head_max_len = token_budget(body, "head_max_len", max_token_budget)
    lang = check_language_param("lang", body.get("lang"))
    lang_guess = check_language_param("lang_guess", body.get("lang_guess"))
    min_confidence = check_min_confidence(body.get("min_confidence"))
    return Controls(model=model, task=body.get("task"), lang=lang, lang_guess=lang_guess,
                    max_len=max_len, head_max_len=head_max_len, min_confidence=min_confidence,
                    unknown_model=unknown_model)
