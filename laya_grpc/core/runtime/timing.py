"""Where one request's time went inside the gateway, only when the client asks for it.

A request carrying `x-laya-timing: 1` gets a response header `x-laya-timing` listing the
milliseconds of each stage in order (`admission_body=0.05;parse=0.07;route=0.03;tokenize_server=...`),
including the backends' own figures (tokenize_server, queue_wait, model) so the transport and
hand-off time of each hop is what the hop took beyond them. `laya-grpc bench` reads it for the
per-hop breakdown. Without the header nothing is recorded: `mark` is one ContextVar lookup.
"""
from __future__ import annotations

import time
from contextvars import ContextVar
from typing import Optional

REQUEST_HEADER = "x-laya-timing"
_current: "ContextVar[Optional[Timing]]" = ContextVar("laya_timing", default=None)


class Timing:
    def __init__(self) -> None:
        self.t = time.perf_counter()
        self.parts: dict = {}

    def mark(self, name: str) -> None:
        now = time.perf_counter()
        self.parts[name] = self.parts.get(name, 0.0) + (now - self.t) * 1e3
        self.t = now

    def header(self) -> str:
        return ";".join("%s=%.3f" % kv for kv in self.parts.items())


def start() -> Timing:
    t = Timing()
    _current.set(t)
    return t


def mark(name: str) -> None:
    t = _current.get()
    if t is not None:
        t.mark(name)


def add(name: str, ms: float) -> None:
    """A figure another process measured (added as is, the clock is not advanced)."""
    t = _current.get()
    if t is not None:
        t.parts[name] = t.parts.get(name, 0.0) + ms


def parse(header: str) -> dict:
    out = {}
    for part in header.split(";"):
        k, _, v = part.partition("=")
        if k:
            out[k] = float(v)
    return out
