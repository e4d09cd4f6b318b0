"""One decision request's bookkeeping, the same for HTTP and gRPC: its id (the client's
x-request-id or a new one), its trace span, its metrics and its access-log line.

    with observed("http", "decide", headers.get("x-request-id"), headers.get("traceparent"),
                  operation="POST /v1/systemone") as scope:
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

from laya_grpc.core.runtime import logs, metrics, request_id, tracing
from laya_grpc.core.errors import Kind, LayaError

CLIENT_CLOSED = 499     # nginx's code for a client that closed the request (gRPC CANCELLED)
DEADLINE_PASSED = 504   # a gRPC client's deadline passed first (DEADLINE_EXCEEDED), however the work ended


class Scope:
    __slots__ = ("request_id", "status", "context", "expired")

    def __init__(self, rid: str, context: request_id.RequestContext):
        self.request_id, self.status, self.context = rid, None, context
        self.expired = None   # () -> bool: whether the client's deadline has passed (set by a gRPC front)


@contextlib.contextmanager
def observed(api: str, route: str, supplied_id: Optional[str] = None, traceparent: Optional[str] = None,
             operation: str = ""):
    """`operation` names the trace span in OpenTelemetry's form (`POST /v1/systemone`,
    `laya_proto.v1.DecisionService/Decide`); `api route` when not given."""
    rid = request_id.accept(supplied_id)
    ctx, token = request_id.begin(rid, traceparent or "")
    scope = Scope(rid, ctx)
    t0 = time.perf_counter()
    try:
        with tracing.request_span(operation or "%s %s" % (api, route), traceparent or "", request_id=rid):
            ctx.traceparent = tracing.traceparent()
            grpc_code = 13   # INTERNAL: what a gRPC client sees for an exception that is no LayaError
            try:
                yield scope
                scope.status = scope.status or 200
                grpc_code = 0
            except LayaError as e:
                expired = e.kind is Kind.TIMEOUT and scope.expired is not None and scope.expired()
                scope.status = DEADLINE_PASSED if expired else e.kind.http_status
                grpc_code = 4 if expired else e.kind.grpc_code.value[0]   # 4: DEADLINE_EXCEEDED
                raise
            except asyncio.CancelledError:
                # the client went away or its deadline passed: no error of ours, and no answer sent
                expired = scope.expired is not None and scope.expired()
                scope.status = DEADLINE_PASSED if expired else CLIENT_CLOSED
                grpc_code = 4 if expired else 1   # DEADLINE_EXCEEDED, CANCELLED
                raise
            finally:
                if tracing.enabled():
                    tracing.finish_request(scope.status or 500, grpc_code if api == "grpc" else None,
                                           checkpoint=ctx.checkpoint)
    finally:
        status = scope.status or 500   # an exception that is no LayaError is a bug: the client saw a 500
        seconds = time.perf_counter() - t0
        metrics.REQUESTS.labels(api, route, str(status)).inc()
        metrics.REQUEST_SECONDS.labels(api, route).observe(seconds)
        logs.access(api, route, status, seconds * 1e3, rid, ctx.checkpoint)
        request_id.end(token)
