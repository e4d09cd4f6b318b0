"""The opt-in `min_confidence` abstention gate, exactly as upstream laya 0.4.15 (`laya/confidence.py`).

Validation happens before any work so a bad threshold is refused with upstream's 422 text. The gate
compares each answer's `answer_confidence` (falling back to `confidence`) with a scalar threshold or
with the threshold of the answer's option-count bucket, and writes `low_confidence` (only when
below), `abstention` and `abstention_threshold` after the answer's other fields. Without
`min_confidence` nothing is written: the presence of `abstention` is how a caller knows a gate ran.
"""
from __future__ import annotations

import math
from typing import Any, Optional, Union

from .errors import Kind, LayaError
from .temperatures import QTYPE_NAMES, option_bucket

Threshold = Union[float, dict[str, float]]

BUCKET_QTYPES = QTYPE_NAMES
BUCKET_SIZES = ("2", "3-5", "6-10", "11+")
DEFAULT_KEY = "default"
_ALLOWED_KEYS = {"%s:%s" % (qt, size) for qt in BUCKET_QTYPES for size in BUCKET_SIZES} | {DEFAULT_KEY}

PASSED, ABSTAINED, UNEVALUATED = "passed", "abstained", "unevaluated"


def _one_threshold(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0.0 or v > 1.0:
        raise LayaError(Kind.INVALID, "min_confidence must be a float in [0.0, 1.0], got %r" % (v,),
                        "min_confidence")
    return float(v)


def check_min_confidence(v: Any) -> Optional[Threshold]:
    """The validated threshold (float or bucket map), None when unset; LayaError(INVALID) otherwise."""
    if v is None:
        return None
    if not isinstance(v, dict):
        return _one_threshold(v)
    if not v:
        raise LayaError(Kind.INVALID, "a min_confidence map must be a non-empty dict of bucket -> float, "
                                      "got %r" % (v,), "min_confidence")
    out: dict[str, float] = {}
    for key, val in v.items():
        if not isinstance(key, str) or key not in _ALLOWED_KEYS:
            raise LayaError(Kind.INVALID, "min_confidence map keys must be a bucket like 'choice:3-5' or "
                                          "'default', got %r" % (key,), "min_confidence")
        out[key] = _one_threshold(val)
    return out


def _usable(x: Any) -> Optional[float]:
    if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x):
        return float(x)
    return None


def _gate_value(answer: dict) -> Optional[float]:
    conf = _usable(answer.get("answer_confidence"))
    return conf if conf is not None else _usable(answer.get("confidence"))


def _answer_bucket(answer: dict) -> Optional[str]:
    """Bucket read off the answer itself (its type and `probabilities` count), as upstream does."""
    qt = answer.get("type")
    if qt not in BUCKET_QTYPES:
        return None
    probs = answer.get("probabilities")
    if isinstance(probs, dict) and probs:
        k = len(probs)
    elif qt == "noul":
        k = 2
    else:
        return None
    return option_bucket(BUCKET_QTYPES.index(qt), k)


def threshold_for(answer: dict, min_confidence: Threshold) -> float:
    """The threshold this answer is gated at: its bucket's, else the map's default, else 0.0."""
    if not isinstance(min_confidence, dict):
        return min_confidence
    key = _answer_bucket(answer)
    if key is not None and key in min_confidence:
        return min_confidence[key]
    return min_confidence.get(DEFAULT_KEY, 0.0)


def apply_gate(answers: dict[str, dict], min_confidence: Optional[Threshold]) -> None:
    """Add the gate fields to every answer in place (nothing when `min_confidence` is None)."""
    if min_confidence is None:
        return
    for answer in answers.values():
        conf = _gate_value(answer)
        threshold = float(threshold_for(answer, min_confidence))
        if conf is not None and conf < threshold:
            answer["low_confidence"] = True
            answer["abstention"] = ABSTAINED
        else:
            answer.pop("low_confidence", None)
            answer["abstention"] = PASSED if conf is not None else UNEVALUATED
        answer["abstention_threshold"] = threshold
