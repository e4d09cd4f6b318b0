"""The request id: taken from the client (`x-request-id` header or gRPC metadata) or minted, then
carried on every internal call (`CallOrigin` in the call messages), returned to the client and
written on every log line about the request.

It lives in a context variable, so everything a request's task runs (and every task it starts)
sees it without passing it through each signature; a service handling an internal call sets it
from the call's origin.
"""
from __future__ import annotations

import contextvars
import uuid
from dataclasses import dataclass, field
from typing import Optional

HEADER = "x-request-id"
MAX_LEN = 128   # a client's id longer than this, or with characters a log line should not hold, is replaced


@dataclass
class RequestContext:
    request_id: str
    checkpoint: str = ""            # set once the request is routed (the access log names it)
    origin_traceparent: str = ""    # the caller's W3C trace context, when the caller sent one
    traceparent: str = ""           # this request's own span's, when tracing is on (log lines after it ended)
    extra: dict = field(default_factory=dict)


_CURRENT: contextvars.ContextVar[Optional[RequestContext]] = contextvars.ContextVar("laya_request", default=None)


def mint() -> str:
    return uuid.uuid4().hex


def accept(supplied: Optional[str]) -> str:
    """The client's id when it is a sane token (printable ASCII, no spaces, at most 128 chars), else a new one."""
    if supplied and len(supplied) <= MAX_LEN and supplied.isascii() and supplied.isprintable() and " " not in supplied:
        return supplied
    return mint()


def current() -> Optional[RequestContext]:
    return _CURRENT.get()


def current_id() -> str:
    ctx = _CURRENT.get()
    return ctx.request_id if ctx is not None else ""


def begin(request_id: str, traceparent: str = "") -> tuple[RequestContext, contextvars.Token]:
    ctx = RequestContext(request_id, origin_traceparent=traceparent)
    return ctx, _CURRENT.set(ctx)


def end(token: contextvars.Token) -> None:
    _CURRENT.reset(token)


def note_checkpoint(name: str) -> None:
    """The routed checkpoint, for the access log (a batch routed to several lists them all)."""
    ctx = _CURRENT.get()
    if ctx is not None and name not in ctx.checkpoint.split(","):
        ctx.checkpoint = name if not ctx.checkpoint else ctx.checkpoint + "," + name


def from_metadata(metadata) -> tuple[str, str]:
    """(x-request-id, traceparent) of gRPC invocation metadata, '' where absent."""
    rid = tp = ""
    for k, v in metadata or ():
        if k == HEADER:
            rid = v if isinstance(v, str) else ""
        elif k == "traceparent":
            tp = v if isinstance(v, str) else ""
    return rid, tp
