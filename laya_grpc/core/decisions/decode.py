"""From one question's raw network outputs to upstream laya 0.4.15's answer, bit for bit.

Pure numpy, so the gateway decodes without torch. The arithmetic mirrors `Agent._decode_answers`
operation for operation in float32 (temperature division, max-shifted softmax, un-permutation,
entropy), because the fields are Python-`round`ed to 4 places and a different summation order or
precision would flip the last digit now and then. The answer is typed (`laya_grpc.core.decisions.answers`),
which renders it in upstream's key order.
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np

from .answers import Answer, ChoiceAnswer, Gate, NoulAnswer, ScoreAnswer
from .confidence_gate import Threshold
from ..errors import Kind, LayaError
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


def decode_answer(question: Question, option_logits: np.ndarray, act_logits: np.ndarray,
                  temperatures: Temperatures, min_confidence: Optional[Threshold] = None) -> Answer:
    """One answer as `Agent.predict` returns it (and the `x_jev_confidence` laya serve adds), with
    the opt-in min_confidence gate's verdict.

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
    act_probability, answer_conf = round(float(act[0]), 4), round(max_confidence(p, k), 4)
    if question.type == "noul":
        p_true = float(p[1])
        conf = round(max(p_true, 1.0 - p_true), 4)
        return NoulAnswer(qid=question.qid, noul=round(p_true, 4), confidence=conf, answer_confidence=answer_conf,
                          act_probability=act_probability, gate=Gate.of("noul", 2, answer_conf, conf, min_confidence))
    conf = round(entropy_confidence(p, k), 4)
    if question.type == "choice":
        # a dict first, as upstream's: equal labels (1, 1.0, True) are one entry, first place, last value
        probabilities = {label: round(float(v), 4) for label, v in zip(question.labels, p)}
        return ChoiceAnswer(qid=question.qid, choice=question.labels[int(p.argmax())], confidence=conf,
                            probabilities=tuple(probabilities.items()), answer_confidence=answer_conf,
                            act_probability=act_probability, jev=jev_confidence("choice", probabilities.values()),
                            gate=Gate.of("choice", len(probabilities), answer_conf, conf, min_confidence))
    levels = tuple(round(float(v), 4) for v in p)
    return ScoreAnswer(qid=question.qid, score=round(float((np.arange(k) * p).sum()), 4),
                       legend=tuple(question.legend.values()), probabilities=levels, confidence=conf,
                       answer_confidence=answer_conf, act_probability=act_probability,
                       gate=Gate.of("score", k, answer_conf, conf, min_confidence), jev=jev_confidence("score", levels))


def jev_confidence(kind: str, p) -> Optional[float]:
    """laya serve's `x_jev_confidence` from a choice or score answer's rounded probabilities (score
    levels in order), 4 places; None when they are not finite non-negative numbers.

    choice: (max p - 1/n)/(1 - 1/n); score: max(0, 1 - sum p_i|i - mode| / D), D the same spread
    for a uniform distribution; 1.0 for a single option (upstream `confidence.jev_confidence`, on p
    normalised to sum 1: max(p)/total is max(p/total), division by a positive number keeping order).
    """
    n, total = len(p), sum(p)
    if not n or not math.isfinite(total) or min(p) < 0.0:   # a NaN or infinity makes the sum one
        return None
    if n == 1:
        return 1.0
    if kind == "choice":
        return round(((max(p) / total if total else 1.0 / n) - 1.0 / n) / (1.0 - 1.0 / n), 4)
    p = [v / total for v in p] if total else [1.0 / n] * n
    mode = max(range(n), key=p.__getitem__)
    spread = sum(v * abs(i - mode) for i, v in enumerate(p))
    center = (n - 1) / 2
    uniform_spread = sum(abs(i - center) for i in range(n)) / n
    return round(max(0.0, 1.0 - spread / uniform_spread), 4)
