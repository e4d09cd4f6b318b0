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

import contextlib
import time
from typing import Optional

from . import logs, metrics, request_id, tracing
from .errors import LayaError


class Scope:
    __slots__ = ("request_id", "status", "context")

    def __init__(self, rid: str, context: request_id.RequestContext):
        self.request_id, self.status, self.context = rid, None, context


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
                scope.status = e.kind.http_status
                grpc_code = e.kind.grpc_code.value[0]
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
