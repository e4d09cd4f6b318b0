"""The opt-in `min_confidence` abstention gate, exactly as upstream laya 0.4.15 (`laya/confidence.py`).

Validation happens before any work so a bad threshold is refused with upstream's 422 text. The gate
(`laya_grpc.core.decisions.answers`, `gated`) compares each answer's `answer_confidence` (falling back to
`confidence`) with a scalar threshold or with the threshold of the answer's option-count bucket, and
writes `low_confidence` (only when below), `abstention` and `abstention_threshold` after the answer's
other fields. Without `min_confidence` nothing is written: the presence of `abstention` is how a
caller knows a gate ran.
"""
from __future__ import annotations

import math
from typing import Any, Optional, Union

from ..errors import Kind, LayaError
from .temperatures import QTYPE_NAMES, option_bucket

Threshold = Union[float, dict[str, float]]

BUCKET_SIZES = ("2", "3-5", "6-10", "11+")
DEFAULT_KEY = "default"
_ALLOWED_KEYS = {"%s:%s" % (qt, size) for qt in QTYPE_NAMES for size in BUCKET_SIZES} | {DEFAULT_KEY}

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


def threshold_for(qtype: str, k: int, min_confidence: Threshold) -> float:
    """The threshold an answer of type `qtype` with `k` probabilities is gated at (upstream reads the
    bucket off the answer itself): its bucket's, else the map's default, else 0.0."""
    if not isinstance(min_confidence, dict):
        return min_confidence
    key = option_bucket(QTYPE_NAMES.index(qtype), k) if k else DEFAULT_KEY
    return min_confidence.get(key, min_confidence.get(DEFAULT_KEY, 0.0))
