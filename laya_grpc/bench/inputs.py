"""The benchmark's requests: fixed, named inputs plus seeded random ones.

Every target (upstream, our engine, gRPC, HTTP) gets the same states and questions, so
their figures compare like for like. Token counts are measured, not assumed (recorded per input).
"""
from __future__ import annotations

import random
from dataclasses import dataclass

_WORDS = ("order parcel refund broken phone screen delivery late customer account invoice charge twice "
          "please help today address change password login error shipping box damaged warranty "
          "replacement store credit card payment declined subscription cancel renew plan upgrade").split()

INTENT = {"type": "choice", "instructions": "What does the customer want?",
          "criteria": {"refund": "money back", "exchange": "a new item", "info": "a question answered"}}
SEVERITY = {"type": "score", "instructions": "How severe is the problem?",
            "criteria": ["none", "minor", "major", "critical"]}
URGENT = {"type": "noul", "instructions": "Is it urgent?", "labels": {"false": "calm", "true": "urgent"}}
CHANNEL = {"type": "choice", "instructions": "Which team should handle it?",
           "criteria": ["billing", "shipping", "technical", "sales"]}
TONE = {"type": "score", "instructions": "How angry is the customer?", "criteria": ["calm", "annoyed", "angry"]}
LANG = {"type": "choice", "instructions": "Which language should the reply use?",
        "criteria": ["english", "german", "french"]}


def _text(n_words: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(_WORDS) for _ in range(n_words)) + "."


@dataclass(frozen=True)
class Case:
    name: str
    state: object
    questions: dict


def named_cases() -> list[Case]:
    """short one-question, 3 and 6 questions, 512 tokens (truncated at max_len), noul."""
    short = "The customer says: " + _text(30, 1)
    return [
        Case("short", short, {"intent": INTENT}),
        Case("q3", short, {"intent": INTENT, "severity": SEVERITY, "urgent": URGENT}),
        Case("q6", short, {"intent": INTENT, "severity": SEVERITY, "urgent": URGENT, "channel": CHANNEL,
                           "tone": TONE, "lang": LANG}),
        Case("t512", "The customer says: " + _text(900, 2), {"intent": INTENT}),
        Case("noul", short, {"urgent": URGENT}),
    ]


def random_cases(n: int, seed: int = 7) -> list[Case]:
    """Random lengths (a few words to past max_len) and 1-6 random questions: the memory soak."""
    rng = random.Random(seed)
    pool = [("intent", INTENT), ("severity", SEVERITY), ("urgent", URGENT), ("channel", CHANNEL), ("tone", TONE),
            ("lang", LANG)]
    out = []
    for i in range(n):
        qs = dict(rng.sample(pool, rng.randint(1, len(pool))))
        out.append(Case("rand%d" % i, _text(rng.randint(3, 700), 100 + i), qs))
    return out
