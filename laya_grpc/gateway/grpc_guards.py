"""The gateway's public gRPC server and its auth guard.

With `LAYA_API_KEY` set, every method except `grpc.health.v1` needs the same bearer token as
HTTP (`authorization: Bearer KEY` metadata), StatusService and reflection included (the status
names checkpoint paths, hashes and configs, which HTTP /health shows only with the key). Without
it a call is UNAUTHENTICATED before its request is even read. DecideStream is the exception: it
checks the token itself (`Policy.auth`, as here) and answers every call on the stream with the
401 (aborting the stream would race the client's first write).

Admission is not taken here: the servicers take it (grpc_api.py), after the request is parsed,
so its cost in rows is known; one `Admission` serves both fronts.
"""
from __future__ import annotations

import grpc

from laya_grpc.core.runtime import metrics
from laya_grpc.core.wire import rpc
from laya_grpc.core.errors import Kind, LayaError
from laya_proto.v1 import decision_pb2

from .admission import MAX_BODY_BYTES
from .policy import UNAUTHORIZED_DETAIL, Policy, bearer_of

_DECISION = "/" + decision_pb2.DESCRIPTOR.services_by_name["DecisionService"].full_name + "/"
SELF_AUTHENTICATING = frozenset({_DECISION + "DecideStream"})
OPEN_PREFIXES = ("/grpc.health.v1.Health/",)
# Far above the HTTP body cap: a request message up to this size is read and refused with the
# typed TOO_LARGE (413's twin, a reply of its own on DecideStream); only a larger one meets the
# transport's own RESOURCE_EXHAUSTED, which on a stream ends the stream.
MAX_PUBLIC_MESSAGE_BYTES = 8 * MAX_BODY_BYTES


class GatewayGuards(grpc.aio.ServerInterceptor):
    def __init__(self, policy: Policy):
        self.policy = policy

    async def intercept_service(self, continuation, details):
        method = details.method
        handler = await continuation(details)
        if (handler is None or method.startswith(OPEN_PREFIXES) or method in SELF_AUTHENTICATING
                or self.policy.auth.allows(bearer_of(details.invocation_metadata))):
            return handler
        return _denied(handler)


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


def public_server(policy: Policy, reuse_port: bool = False, options=()) -> grpc.aio.Server:
    """The gateway's gRPC server: the auth guard on, messages capped (a client cannot make the
    gateway buffer 64 MiB messages, the internal services' cap); `options`: its connection limits
    (conn_limits.grpc_server_options)."""
    return rpc.server(reuse_port=reuse_port, interceptors=[GatewayGuards(policy)],
                      max_receive_bytes=MAX_PUBLIC_MESSAGE_BYTES, options=options)
