"""The client's deadline, carried to the backend calls a request makes.

A gRPC client's deadline (`context.time_remaining()`) or the HTTP request timeout
(`--request-timeout-seconds`) is set here once per request (a context variable, so concurrent requests
never see each other's); every tokenizer and inference call then asks for at most the time left,
so a backend stops working for a client that has given up, and retries stay inside the deadline.
"""
from __future__ import annotations

import contextlib
import contextvars
import time
from typing import Iterator, Optional

from laya_grpc.core.errors import Kind, LayaError

_DEADLINE: contextvars.ContextVar[Optional[float]] = contextvars.ContextVar("laya_deadline", default=None)


@contextlib.contextmanager
def within(seconds: Optional[float]) -> Iterator[None]:
    """Run the block under a deadline `seconds` from now (None: no deadline of its own); an outer,
    earlier deadline still wins."""
    if seconds is None:
        yield
        return
    at = time.monotonic() + max(0.0, seconds)
    outer = _DEADLINE.get()
    token = _DEADLINE.set(at if outer is None else min(at, outer))
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def left() -> Optional[float]:
    """Seconds until the request's deadline (None: it has none)."""
    at = _DEADLINE.get()
    return None if at is None else max(0.0, at - time.monotonic())


def timeout(cap: float) -> float:
    """Seconds a backend call may take: `cap`, or less when the request's deadline is nearer."""
    at = _DEADLINE.get()
    if at is None:
        return cap
    left = at - time.monotonic()
    if left <= 0:
        raise LayaError(Kind.TIMEOUT, "the request's deadline passed before its backend call")
    return min(cap, left)
