"""gRPC plumbing shared by every service: options, servers, error mapping, health.

Message-size limits and keepalive are set here once, symmetrically for servers and channels
(a mismatch makes grpc fail in-flight calls with RESOURCE_EXHAUSTED or "too_many_pings").
"""
from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import os
from typing import Awaitable, Callable, Iterable, Optional

import grpc
from google.protobuf import duration_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2
from grpc_status import rpc_status

from ..runtime import flags
from ..errors import (ERROR_DOMAIN, KIND_METADATA_KEY, RETRY_AFTER_HEADER, RETRY_AFTER_KEY, RETRY_DELAY_S, Kind,
                      LayaError, from_grpc)
from ..runtime.logs import clip

log = logging.getLogger("laya_grpc.core.wire.rpc")

MAX_MESSAGE_BYTES = int(flags.external("LAYA_GRPC_MAX_MESSAGE_BYTES") or 64 * 1024 * 1024)

# Servers send GOAWAY on each connection this long after it opened (gRPC adds +-10% jitter), so
# clients dial again and re-resolve a dns:/// name: a replica added behind the name gets calls
# within about this long (without it, only when a connection broke; grpc/grpc#12295). Calls running
# on the old connection are not cut: the grace is unbounded, because a multiplexed stream
# (core/wire/calls.py) and a status or health watch live as long as their process.
MAX_CONNECTION_AGE_S = float(flags.external("LAYA_GRPC_MAX_CONNECTION_AGE_S") or 30)
_UNBOUNDED_MS = 2**31 - 1

_COMMON = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]
SERVER_OPTIONS = _COMMON + [
    ("grpc.max_connection_age_ms", int(MAX_CONNECTION_AGE_S * 1000)),
    ("grpc.max_connection_age_grace_ms", _UNBOUNDED_MS),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 5_000),
    ("grpc.http2.max_ping_strikes", 0),
]
CHANNEL_OPTIONS = _COMMON + [
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    # Reconnect fast after a supervised child restarts.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1_000),
    ("grpc.enable_retries", 0),
    # a dns:/// name is looked up again when a connection ends (GOAWAY at the servers' maximum
    # age included), at most this often (gRPC's default: 30 s)
    ("grpc.dns_min_time_between_resolutions_ms", int(min(30.0, MAX_CONNECTION_AGE_S) * 1000)),
]


def target(address: str) -> str:
    """`unix:/path`, `unix:///path`, `/path.sock` or `host:port` -> a grpc target."""
    if address.startswith("unix:"):
        return address
    if address.startswith("/"):
        return "unix:" + address
    return address


def bind(server: grpc.aio.Server, address: str) -> str:
    t = target(address)
    if t.startswith("unix:"):
        path = t[len("unix:"):]
        path = path[2:] if path.startswith("//") else path      # unix:///abs and unix:/abs; unix:rel stays relative
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        if os.path.exists(path):
            os.unlink(path)  # stale socket of a previous instance
    port = server.add_insecure_port(t)
    if not t.startswith("unix:") and t.endswith(":0"):
        t = t[: -len(":0")] + ":%d" % port
    return t


def channel(address: str) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(target(address), options=CHANNEL_OPTIONS)


def server(max_concurrent_rpcs: Optional[int] = None, interceptors=None, reuse_port: bool = False,
           max_receive_bytes: Optional[int] = None, options=()) -> grpc.aio.Server:
    """reuse_port lets several processes serve one TCP port (the kernel spreads connections);
    off by default so that a port already in use is an error, not a silent share. Every server
    answers an undecodable request message with INVALID_ARGUMENT (UndecodableRequests);
    `max_receive_bytes` lowers the message cap of a public server below the internal one; `options`
    (channel arguments) replace the defaults of the same name."""
    extra = list(options) + ([("grpc.max_receive_message_length", max_receive_bytes)]
                             if max_receive_bytes is not None else [])
    names = {name for name, _ in extra}
    options = [o for o in SERVER_OPTIONS if o[0] not in names] + [("grpc.so_reuseport", int(reuse_port))] + extra
    return grpc.aio.server(options=options, maximum_concurrent_rpcs=max_concurrent_rpcs,
                           interceptors=[UndecodableRequests()] + list(interceptors or ()))


REFLECTION_V1 = "grpc.reflection.v1.ServerReflection"


def add_health_and_reflection(srv: grpc.aio.Server, service_names: Iterable[str]) -> health.aio.HealthServicer:
    """Standard grpc.health.v1 (Check + Watch) and reflection, both `grpc.reflection.v1` (what
    current grpcurl and Postman ask first) and `v1alpha`; all services start NOT_SERVING.

    grpcio-reflection ships only v1alpha; v1 is the same messages under another package name, so
    the one servicer answers both."""
    hs = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(hs, srv)
    names = list(service_names) + [health.SERVICE_NAME, REFLECTION_V1, reflection.SERVICE_NAME]
    servicer = reflection.aio.ReflectionServicer(names)
    _add_reflection(servicer, srv, reflection.SERVICE_NAME)
    _add_reflection(servicer, srv, REFLECTION_V1)
    return hs


def _add_reflection(servicer, srv: grpc.aio.Server, service: str) -> None:
    srv.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, {
        "ServerReflectionInfo": grpc.stream_stream_rpc_method_handler(
            servicer.ServerReflectionInfo,
            request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
            response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString)}),))


async def set_health(hs: health.aio.HealthServicer, names: Iterable[str], serving: bool) -> None:
    status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
    for name in list(names) + [""]:
        await hs.set(name, status)


DETAIL_CHARS = 1000    # message, then again as BadRequest's description: ~2 KiB of the 8 KiB metadata
FIELD_CHARS = 300


def status_of(err: LayaError) -> status_pb2.Status:
    """The one LayaError -> `google.rpc.Status` mapping: the kind's code and the detail, with
    ErrorInfo (reason = the kind name, metadata.http_status = the HTTP twin's status), BadRequest
    on INVALID_ARGUMENT (the field at fault when known) and RetryInfo when a retry can succeed
    (BUSY). A too-large request (RESOURCE_EXHAUSTED) gets no RetryInfo: the same request fails again.

    The detail and field are clipped (DETAIL_CHARS, FIELD_CHARS): a detail that echoes a
    20,000-character id must not push the status past gRPC's 8 KiB metadata limit, which would
    turn it into a RESOURCE_EXHAUSTED that clients retry."""
    detail, field = clip(err.detail, DETAIL_CHARS), clip(err.field, FIELD_CHARS)
    st = status_pb2.Status(code=err.kind.grpc_code.value[0], message=detail)
    st.details.add().Pack(error_details_pb2.ErrorInfo(reason=err.kind.name, domain=ERROR_DOMAIN,
                                                      metadata={"http_status": str(err.kind.http_status)}))
    if err.kind.grpc_code == grpc.StatusCode.INVALID_ARGUMENT:
        st.details.add().Pack(error_details_pb2.BadRequest(field_violations=[
            error_details_pb2.BadRequest.FieldViolation(field=field, description=detail)]))
    if err.kind is Kind.BUSY:
        st.details.add().Pack(error_details_pb2.RetryInfo(
            retry_delay=duration_pb2.Duration(seconds=int(RETRY_DELAY_S), nanos=int(RETRY_DELAY_S % 1 * 1e9))))
    return st


# gRPC's own retry policy (gRFC A6) waits exactly this long before its next attempt, instead of its
# jittered backoff, which would re-send before the retry delay (and be refused for it)
PUSHBACK_KEY = "grpc-retry-pushback-ms"
PUSHBACK_MS = "%d" % (RETRY_DELAY_S * 1000)


def retry_delay_of(st: status_pb2.Status) -> Optional[float]:
    """The RetryInfo delay of a status, in seconds (None when it has none)."""
    for d in st.details:
        if d.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            info = error_details_pb2.RetryInfo()
            d.Unpack(info)
            return info.retry_delay.seconds + info.retry_delay.nanos / 1e9
    return None


async def abort(context: grpc.aio.ServicerContext, err: LayaError):
    """Fail the call with `status_of(err)`; the kind also travels as trailing metadata, so a hop
    between our own services keeps it without parsing the details, and BUSY adds `retry-after`
    (seconds, as HTTP's Retry-After) and `grpc-retry-pushback-ms`, which gRPC's retry policy obeys.

    A call whose deadline passed or whose client left in the same instant has already ended in
    gRPC's core, which refuses the status batch; nobody is left to read it, so the call ends as
    cancelled (logged at debug) instead of an ExecuteBatchError traceback in the log. A status batch
    the core refuses to start (two batches sending the headers at once, say) is a bug of ours, and
    its client is left to its deadline: that is logged as a warning."""
    st = rpc_status.to_status(status_of(err))
    extra = ((KIND_METADATA_KEY, err.kind.name),)
    if err.kind is Kind.BUSY:
        extra += ((RETRY_AFTER_KEY, RETRY_AFTER_HEADER), (PUSHBACK_KEY, PUSHBACK_MS))
    try:
        await context.abort(st.code, st.details, trailing_metadata=tuple(st.trailing_metadata) + extra)
    except grpc.aio.AbortError:
        raise
    except Exception as e:  # noqa: BLE001 - cygrpc.ExecuteBatchError, which grpc does not export
        if "grpc_call_start_batch" in str(e):   # refused before it ran (e.g. TOO_MANY_OPERATIONS): a bug of
            log.warning("status %s not sent: %s", err.kind.name, e)   # ours, and the client waits for its deadline
        else:
            log.debug("status %s not sent, the call had ended: %s", err.kind.name, e)
        raise asyncio.CancelledError() from e


def servicer_errors(fn: Callable[..., Awaitable]):
    """Decorator for aio servicer methods: LayaError -> its gRPC status; anything else -> INTERNAL, logged."""
    @functools.wraps(fn)
    async def wrapped(self, request, context):
        try:
            return await fn(self, request, context)
        except LayaError as e:
            await abort(context, e)
        except grpc.aio.AbortError:
            raise
        except Exception as e:  # a bug: log with traceback, keep serving
            log.exception("%s failed", fn.__name__)
            await abort(context, LayaError(Kind.INTERNAL, "%s failed: %s: %s" % (fn.__name__, type(e).__name__, e)))
    return wrapped


def field_of(e: grpc.RpcError) -> str:
    """The BadRequest field path in a failed call's google.rpc.Status details ("" when none)."""
    try:
        st = rpc_status.from_call(e)
    except ValueError:
        return ""
    for detail in st.details if st is not None else ():
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            br = error_details_pb2.BadRequest()
            detail.Unpack(br)
            for v in br.field_violations:
                return v.field
    return ""


def error_from_rpc(e: grpc.RpcError, what: str = "") -> LayaError:
    """Turn a failed call to one of our services back into the LayaError it was raised as.

    A call that failed in the transport (no kind attached) becomes BUSY without gRPC's own text:
    that text names socket paths and addresses, which stay in this process's log."""
    kind_name = None
    for k, v in (e.trailing_metadata() or ()):
        if k == KIND_METADATA_KEY:
            kind_name = v
    if not kind_name and e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNKNOWN,
                                      grpc.StatusCode.INTERNAL, grpc.StatusCode.CANCELLED):
        log.warning("%s: %s: %s", what or "backend service", e.code().name, e.details())
        if e.code() == grpc.StatusCode.UNAVAILABLE:
            return LayaError(Kind.BUSY, transport_detail(what))
        return LayaError(Kind.INTERNAL, "%s failed: %s" % (what or "backend service", e.code().name))
    return from_grpc(e.code(), e.details(), kind_name, field_of(e) if kind_name else "")


def transport_detail(what: str) -> str:
    """What a client reads when a backend cannot be reached (never its address)."""
    return "%s unavailable: not reachable" % (what or "backend service")


class _Undecodable:
    """What a request that is not a valid message of its type deserializes to (never raised
    inside grpc, which would answer UNKNOWN and log a traceback)."""
    __slots__ = ("error",)

    def __init__(self, error: Exception):
        self.error = error


def _tolerant(deserialize: Optional[Callable]) -> Optional[Callable]:
    if deserialize is None:
        return None

    def parse(raw: bytes):
        try:
            return deserialize(raw)
        except Exception as e:  # noqa: BLE001 - DecodeError, or whatever a parser raises on garbage
            return _Undecodable(e)
    return parse


async def _refuse(context, bad: _Undecodable):
    log.debug("undecodable request: %s", bad.error)
    await abort(context, LayaError(Kind.BAD_REQUEST, "request is not a valid protobuf message of this method's type"))


async def _checked_stream(requests, context):
    async for request in requests:
        if isinstance(request, _Undecodable):
            await _refuse(context, request)
        yield request


class UndecodableRequests(grpc.aio.ServerInterceptor):
    """Undecodable protobuf gets INVALID_ARGUMENT on every method (health, reflection and
    streams included), without a traceback in the log: the request deserializer hands a marker
    instead of raising, and the method's behaviour refuses it before running."""

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        des = _tolerant(handler.request_deserializer)
        if handler.unary_unary is not None:
            return handler._replace(request_deserializer=des, unary_unary=_unary_request(handler.unary_unary))
        if handler.unary_stream is not None:
            return handler._replace(request_deserializer=des, unary_stream=_unary_request_stream(handler.unary_stream))
        if handler.stream_unary is not None:
            return handler._replace(request_deserializer=des, stream_unary=_stream_request(handler.stream_unary))
        return handler._replace(request_deserializer=des, stream_stream=_stream_request_stream(handler.stream_stream))


def _unary_request(behavior):
    async def run(request, context):
        if isinstance(request, _Undecodable):
            await _refuse(context, request)
        return await behavior(request, context)
    return run


def _unary_request_stream(behavior):
    if inspect.isasyncgenfunction(behavior):    # yields its responses
        async def relay(request, context):
            if isinstance(request, _Undecodable):
                await _refuse(context, request)
            async for response in behavior(request, context):
                yield response
        return relay

    async def run(request, context):            # writes them with context.write
        if isinstance(request, _Undecodable):
            await _refuse(context, request)
        return await behavior(request, context)
    return run


def _stream_request(behavior):
    async def run(requests, context):
        return await behavior(_checked_stream(requests, context), context)
    return run


def _stream_request_stream(behavior):
    if inspect.isasyncgenfunction(behavior):
        async def relay(requests, context):
            async for response in behavior(_checked_stream(requests, context), context):
                yield response
        return relay

    async def run(requests, context):
        return await behavior(_checked_stream(requests, context), context)
    return run
