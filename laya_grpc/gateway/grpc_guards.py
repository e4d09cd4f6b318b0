"""The gateway's public gRPC server and its guards: bearer auth on everything but the probes,
and the HTTP front's admission limit on the decision calls.

Auth: with `LAYA_API_KEY` set, every method except `grpc.health.v1` needs the same bearer token
as HTTP (`authorization: Bearer KEY` metadata), StatusService and reflection included (the
status names checkpoint paths, hashes, configs and socket paths, which HTTP /health shows only
with the key). Without it a call is UNAUTHENTICATED before its request is even read.
DecideStream is the exception that proves it: it checks the token itself and answers every call
on the stream with the 401 (aborting the stream would race the client's first write).

Admission: Decide and DecideBatch take a slot of the one `Admission` the HTTP app uses, so
`LAYA_MAX_CONCURRENT` bounds both transports together (each DecideStream call takes one too, in
grpc_api.py, and is answered UNAVAILABLE with the 503's detail when none is free). Over it a call gets RESOURCE_EXHAUSTED at
once, with a google.rpc RetryInfo detail and `retry-after: 1` trailing metadata (HTTP: 503 +
`Retry-After: 1`).
"""
from __future__ import annotations

import hmac
from typing import Optional

import grpc
from google.rpc import code_pb2
from grpc_status import rpc_status

from laya_grpc.core import metrics, rpc
from laya_grpc.core.errors import KIND_METADATA_KEY, Kind, LayaError
from laya_proto.v1 import decision_pb2

from .admission import BUSY_DETAIL, MAX_BODY_BYTES, Admission
from .http_app import UNAUTHORIZED_DETAIL

_DECISION = "/" + decision_pb2.DESCRIPTOR.services_by_name["DecisionService"].full_name + "/"
ADMITTED_METHODS = frozenset({_DECISION + "Decide", _DECISION + "DecideBatch"})
SELF_AUTHENTICATING = frozenset({_DECISION + "DecideStream"})
OPEN_PREFIXES = ("/grpc.health.v1.Health/",)
RETRY_AFTER_KEY = "retry-after"
RETRY_AFTER_S = "1"
# The HTTP body cap plus room for the protobuf framing of the same content.
MAX_PUBLIC_MESSAGE_BYTES = 2 * MAX_BODY_BYTES


class GatewayGuards(grpc.aio.ServerInterceptor):
    def __init__(self, api_key: Optional[str], admission: Admission):
        self.admission = admission
        self._expected = ("Bearer " + api_key).encode("utf-8", "surrogateescape") if api_key else None

    def _authorized(self, metadata) -> bool:
        if self._expected is None:
            return True
        supplied = ""
        for key, value in metadata or ():
            if key == "authorization":
                supplied = value
        if isinstance(supplied, bytes):
            supplied = supplied.decode("latin-1")
        return hmac.compare_digest(supplied.encode("utf-8", "surrogateescape"), self._expected)

    async def intercept_service(self, continuation, details):
        method = details.method
        if method.startswith(OPEN_PREFIXES):
            return await continuation(details)
        if (method not in SELF_AUTHENTICATING and self._expected is not None
                and not self._authorized(details.invocation_metadata)):
            handler = await continuation(details)
            return None if handler is None else _denied(handler)
        handler = await continuation(details)
        if handler is None or method not in ADMITTED_METHODS or handler.unary_unary is None:
            return handler
        return handler._replace(unary_unary=self._admitted(handler.unary_unary))

    def _admitted(self, behavior):
        admission = self.admission

        async def run(request, context):
            if not admission.try_acquire():
                metrics.REJECTED.labels("grpc", "busy").inc()
                await _busy(context)
            try:
                admission.trim.add(request.ByteSize())   # ~0.5 ms per MiB: small beside the work it measures
                return await behavior(request, context)
            finally:
                admission.release()
        return run


async def _busy(context):
    """RESOURCE_EXHAUSTED with BUSY's google.rpc.Status details (ErrorInfo, RetryInfo) and the
    `retry-after` metadata."""
    st = rpc.status_of(LayaError(Kind.BUSY, BUSY_DETAIL))
    st.code = code_pb2.RESOURCE_EXHAUSTED
    status = rpc_status.to_status(st)
    await context.abort(status.code, status.details, trailing_metadata=tuple(status.trailing_metadata) + (
        (RETRY_AFTER_KEY, RETRY_AFTER_S), (KIND_METADATA_KEY, Kind.BUSY.name)))


async def _deny(context):
    metrics.REJECTED.labels("grpc", "unauthenticated").inc()
    await rpc.abort(context, LayaError(Kind.UNAUTHENTICATED, UNAUTHORIZED_DETAIL))


def _denied(handler):
    """`handler` with its behaviour replaced by the 401, same streaming shape (the request is
    never read)."""
    if handler.unary_unary is not None:
        async def unary_unary(request, context):
            await _deny(context)
        return handler._replace(unary_unary=unary_unary)
    if handler.unary_stream is not None:
        async def unary_stream(request, context):
            await _deny(context)
        return handler._replace(unary_stream=unary_stream)
    if handler.stream_unary is not None:
        async def stream_unary(requests, context):
            await _deny(context)
        return handler._replace(stream_unary=stream_unary)

    async def stream_stream(requests, context):
        await _deny(context)
    return handler._replace(stream_stream=stream_stream)


def public_server(api_key: Optional[str], admission: Admission, reuse_port: bool = False,
                  options=()) -> grpc.aio.Server:
    """The gateway's gRPC server: guards on, messages capped near the HTTP body cap (a client
    cannot make the gateway buffer 64 MiB messages, the internal services' cap); `options`: its
    connection limits (conn_limits.grpc_server_options)."""
    return rpc.server(reuse_port=reuse_port, interceptors=[GatewayGuards(api_key, admission)],
                      max_receive_bytes=MAX_PUBLIC_MESSAGE_BYTES, options=options)
