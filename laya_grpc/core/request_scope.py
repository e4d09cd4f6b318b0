"""One decision request's bookkeeping, the same for HTTP and gRPC: its id (the client's
x-request-id or a new one), its trace span, its metrics and its access-log line.

    with observed("http", "decide", headers.get("x-request-id"), headers.get("traceparent")) as scope:
        ...                      # scope.request_id goes back to the client
        ...                      # 200 unless scope.status says otherwise or a LayaError raised
                                 # through sets its kind's status

With tracing off the per-request cost is minting or checking the id, two metric updates and one
log record.
"""
from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Optional

from . import logs, metrics, request_id, tracing
from .errors import Kind, LayaError

CLIENT_CLOSED = 499     # nginx's code for a client that closed the request (gRPC CANCELLED)
DEADLINE_PASSED = 504   # a gRPC client's deadline passed first (DEADLINE_EXCEEDED), however the work ended


class Scope:
    __slots__ = ("request_id", "status", "context", "expired")

    def __init__(self, rid: str, context: request_id.RequestContext):
        self.request_id, self.status, self.context = rid, None, context
        self.expired = None   # () -> bool: whether the client's deadline has passed (set by a gRPC front)


@contextlib.contextmanager
def observed(api: str, route: str, supplied_id: Optional[str] = None, traceparent: Optional[str] = None):
    rid = request_id.accept(supplied_id)
    ctx, token = request_id.begin(rid, traceparent or "")
    scope = Scope(rid, ctx)
    t0 = time.perf_counter()
    try:
        with tracing.request_span("%s %s" % (api, route), traceparent or "", **{"laya.request_id": rid}):
            try:
                yield scope
                scope.status = scope.status or 200
            except LayaError as e:
                expired = e.kind is Kind.TIMEOUT and scope.expired is not None and scope.expired()
                scope.status = DEADLINE_PASSED if expired else e.kind.http_status
                raise
            except asyncio.CancelledError:
                # the client went away or its deadline passed: no error of ours, and no answer sent
                scope.status = DEADLINE_PASSED if scope.expired is not None and scope.expired() else CLIENT_CLOSED
                raise
            finally:
                if tracing.enabled():
                    tracing.set_attributes(**{"laya.status": scope.status or 500, "laya.checkpoint": ctx.checkpoint})
    finally:
        status = scope.status or 500   # an exception that is no LayaError is a bug: the client saw a 500
        seconds = time.perf_counter() - t0
        metrics.REQUESTS.labels(api, route, str(status)).inc()
        metrics.REQUEST_SECONDS.labels(api, route).observe(seconds)
        logs.access(api, route, status, seconds * 1e3, rid, ctx.checkpoint)
        request_id.end(token)
