"""Restart counts that survive a gateway restart.

The gateway counts each backend's restarts by watching it go down, so a restarted gateway would
report 0 for everything. The supervisor (`laya-grpc serve`) is the one process that sees every
restart: it hands each child it spawns the counts so far in `LAYA_SUPERVISOR_RESTARTS`
("tokenizer-0=2,inference=1,gateway-0=1"), and the gateway starts its counters from them.
Set by the supervisor only; a gateway started on its own has none and counts from 0.
"""
from __future__ import annotations

from typing import Mapping, Optional

from . import flags

RESTARTS_ENV = "LAYA_SUPERVISOR_RESTARTS"


def format_restarts(counts: Mapping[str, int]) -> str:
    return ",".join("%s=%d" % (name, n) for name, n in counts.items())


def parse_restarts(text: Optional[str]) -> dict:
    """`format_restarts`'s text back to {child name: restarts}; anything malformed is skipped."""
    out = {}
    for part in (text or "").split(","):
        name, _, n = part.partition("=")
        if name and n.strip().isdigit():
            out[name.strip()] = int(n)
    return out


def seed_backend_restarts(tokenizers, inferences, env: Optional[Mapping[str, str]] = None) -> dict:
    """Start the gateway's per-backend counters (`Backend.downs`) from the supervisor's counts:
    tokenizer i is the supervisor's `tokenizer-i`, in --tokenizer order; inference replica k is
    `inference-k` (one replica: `inference`), in --inference order. Returns the counts."""
    counts = parse_restarts(flags.external(RESTARTS_ENV) if env is None else env.get(RESTARTS_ENV))
    for i, b in enumerate(tokenizers):
        b.downs = max(b.downs, counts.get("tokenizer-%d" % i, 0))
    inferences = list(inferences)
    for k, b in enumerate(inferences):
        name = "inference" if len(inferences) == 1 else "inference-%d" % k
        b.downs = max(b.downs, counts.get(name, 0))
    return counts
