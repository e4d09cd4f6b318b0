"""From one question's raw network outputs to upstream laya 0.4.15's answer dict, bit for bit.

Pure numpy, so the gateway decodes without torch. The arithmetic mirrors `Agent._decode_answers`
operation for operation in float32 (temperature division, max-shifted softmax, un-permutation,
entropy), because the fields are Python-`round`ed to 4 places and a different summation order or
precision would flip the last digit now and then. Field order is upstream's emit order.

`decode_answer` is what `Agent.predict` returns per question; `add_serve_fields` adds what
`laya serve` puts on top for HTTP (`x_jev_confidence`), and `project_jev_strict` is its
`LAYA_JEV_STRICT` projection.
"""
from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np

from .errors import Kind, LayaError
from .questions import Question
from .temperatures import Temperatures


def softmax_f32(x: np.ndarray) -> np.ndarray:
    """Max-shifted float32 softmax, upstream's numpy form."""
    p = np.exp(x - x.max())
    p /= p.sum()
    return p


def unpermute(p: np.ndarray, option_order: Optional[tuple[int, ...]]) -> np.ndarray:
    """Slot-ordered row -> option order: slot s showed option `option_order[s]`."""
    if option_order is None or len(option_order) != len(p):
        return p
    canonical = np.empty_like(p)
    canonical[np.asarray(option_order, dtype=int)] = p
    return canonical


def entropy_confidence(p: np.ndarray, k: int) -> float:
    """1 - H(p)/ln k clipped to [0, 1]; 1.0 below two options (upstream `confidence_from_probs`)."""
    if k < 2:
        return 1.0
    pk = p[:k]
    ent = -float((pk * np.log(np.clip(pk, 1e-12, 1.0))).sum())
    score = 1.0 - ent / math.log(k)
    return 0.0 if score < 0.0 else (1.0 if score > 1.0 else score)


def max_confidence(p: np.ndarray, k: int) -> float:
    """max(p) clipped to [0, 1] (upstream `answer_confidence`)."""
    if k < 1:
        return 1.0
    val = float(p[:k].max())
    return 0.0 if val < 0.0 else (1.0 if val > 1.0 else val)


MODEL_TAG = "laya-rl-agent"   # upstream's constant family tag; the checkpoint is in routing.model


def empty_result() -> dict[str, Any]:
    """Upstream's answer to an empty question set: no tokenization, no forward pass."""
    return {"model": MODEL_TAG, "answers": {}, "usage": {"input_tokens": 0, "output_tokens": 0}}


def decode_answer(question: Question, option_logits: np.ndarray, act_logits: np.ndarray,
                  temperatures: Temperatures) -> dict[str, Any]:
    """One answer as `Agent.predict` returns it.

    `option_logits`: float32 [k], one per option marker, in SLOT order (as fed to the model).
    `act_logits`: float32 [n_act]; `act_probability` is softmax(act_logits)[0]. Upstream takes
    that softmax in torch, whose float32 exp differs from numpy's by an ulp now and then, so about
    1 act_probability in 10^4 can differ by 1e-4 (the shipped act logits saturate it at 1.0).
    """
    logits = np.asarray(option_logits, dtype=np.float32)
    k = int(logits.shape[0])
    if k != len(question.options):
        raise LayaError(Kind.INTERNAL, "question %r: %d option logits for %d options"
                        % (question.qid, k, len(question.options)))
    t = temperatures.for_question(question.qtype, k)
    p = unpermute(softmax_f32(logits / t), question.option_order)
    act = softmax_f32(np.asarray(act_logits, dtype=np.float32))
    action = {"act_probability": round(float(act[0]), 4)}
    answer_conf = round(max_confidence(p, k), 4)

    if question.type == "choice":
        labels = list(question.labels)
        return {
            "type": "choice",
            "choice": labels[int(p.argmax())],
            "probabilities": {label: round(float(v), 4) for label, v in zip(labels, p)},
            "confidence": round(entropy_confidence(p, k), 4),
            "answer_confidence": answer_conf,
            "action": action,
        }
    if question.type == "score":
        return {
            "type": "score",
            "score": round(float((np.arange(k) * p).sum()), 4),
            "legend": dict(question.legend),
            "probabilities": {str(i): round(float(v), 4) for i, v in enumerate(p)},
            "confidence": round(entropy_confidence(p, k), 4),
            "answer_confidence": answer_conf,
            "action": action,
        }
    p_true = float(p[1])
    return {
        "type": "noul",
        "noul": round(p_true, 4),
        "confidence": round(max(p_true, 1.0 - p_true), 4),
        "answer_confidence": answer_conf,
        "action": action,
    }


def jev_confidence(answer: dict[str, Any]) -> Optional[float]:
    """Jev's `confidence` for a choice/score answer's (rounded) probabilities, else None.

    choice: (max p - 1/n)/(1 - 1/n); score: max(0, 1 - sum p_i|i - mode| / D), D the same spread
    for a uniform distribution; 1.0 for a single option (upstream `confidence.jev_confidence`).
    """
    kind = answer.get("type")
    probabilities = answer.get("probabilities")
    if kind not in ("choice", "score") or not isinstance(probabilities, dict) or not probabilities:
        return None
    try:
        if kind == "score":
            p = [float(probabilities[key]) for key in sorted(probabilities, key=int)]
        else:
            p = [float(value) for value in probabilities.values()]
    except (TypeError, ValueError):
        return None
    if (any(isinstance(v, bool) for v in probabilities.values())
            or not all(math.isfinite(v) and v >= 0.0 for v in p)):
        return None
    n = len(p)
    if n == 1:
        return 1.0
    total = sum(p)
    p = [v / total for v in p] if total else [1.0 / n] * n
    if kind == "choice":
        return (max(p) - 1.0 / n) / (1.0 - 1.0 / n)
    mode = max(range(n), key=p.__getitem__)
    spread = sum(v * abs(i - mode) for i, v in enumerate(p))
    center = (n - 1) / 2
    uniform_spread = sum(abs(i - center) for i in range(n)) / n
    return max(0.0, 1.0 - spread / uniform_spread)


def add_serve_fields(result: dict[str, Any]) -> dict[str, Any]:
    """`result` (an `Agent.predict` payload) with `laya serve`'s per-answer additions.

    `x_jev_confidence` goes last on every choice and score answer, after any gate fields, as
    `serve._add_jev_confidence` appends it. The result is copied, not edited.
    """
    answers = {}
    for qid, answer in result["answers"].items():
        conf = jev_confidence(answer)
        answers[qid] = answer if conf is None else {**answer, "x_jev_confidence": round(conf, 4)}
    return {**result, "answers": answers}


def project_jev_strict(result: dict[str, Any]) -> dict[str, Any]:
    """`LAYA_JEV_STRICT`: only the Jev contract's keys, in upstream's strict key order."""
    answers: dict[str, Any] = {}
    for qid, a in result["answers"].items():
        if a["type"] == "choice":
            answers[qid] = {"type": "choice", "choice": a["choice"], "confidence": a["confidence"],
                            "probabilities": a["probabilities"]}
        elif a["type"] == "score":
            answers[qid] = {"type": "score", "score": a["score"], "confidence": a["confidence"],
                            "probabilities": a["probabilities"], "legend": a["legend"]}
        else:
            answers[qid] = {"type": "noul", "noul": a["noul"]}
    usage = result.get("usage") or {}
    return {"model": result["model"], "answers": answers,
            "usage": {"input_tokens": usage.get("input_tokens", 0),
                      "output_tokens": usage.get("output_tokens", 0)}}
