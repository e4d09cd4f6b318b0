"""OpenTelemetry tracing, off unless `--otlp-endpoint` is set (env LAYA_OTLP_ENDPOINT).

One trace per request: the gateway's request span (a child of the client's `traceparent` when it
sent one) holds `tokenize`, `infer` and `decode`; the tokenizer and inference services continue
the trace from the W3C traceparent carried in each internal call's `CallOrigin` (calls share
long-lived streams, so there is no per-call metadata to carry it). The inference batcher runs one
forward pass for many requests: the inference service records that pass in *each* request's
trace (`inference.queue` then `inference.forward`, same timestamps in every trace, attributes
saying how many rows and requests shared it), so one trace shows every hop of its request.

Names and attributes follow OpenTelemetry's semantic conventions where one exists: the request
span of an HTTP request is `{method} {route}` with `http.request.method`, `http.route`, `url.path`
and `http.response.status_code`; a gRPC request's, and the services' spans of the internal calls,
are `{service}/{method}` with `rpc.system`, `rpc.service`, `rpc.method` and, for the request,
`rpc.grpc.status_code`. This product's own facts are keyword arguments of the helpers here and
are namespaced `laya.` (`laya.request_id`, `laya.checkpoint`, `laya.batch_rows`, ...). Each
process's resource says which service, version, host and (from the downward-API variables
K8S_POD_NAME, K8S_NAMESPACE_NAME, K8S_NODE_NAME) which pod it is; OTEL_RESOURCE_ATTRIBUTES adds more.

opentelemetry-sdk and the OTLP exporter are the `otel` extra and are imported only when tracing
is enabled; with it off every helper here is a constant no-op (no per-request work).
"""
from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from typing import Iterable, Optional

from . import flags

log = logging.getLogger("laya_grpc.core.runtime.tracing")

_NOOP = contextlib.nullcontext()
# The services' spans of the internal calls (the contract's RPCs, whichever transport carries them).
TOKENIZE = "laya_proto.v1.TokenizerService/Tokenize"
INFER = "laya_proto.v1.InferenceService/Infer"
_tracer = None        # an opentelemetry Tracer once enabled
_provider = None
_propagator = None


def enabled() -> bool:
    return _tracer is not None


def setup(service: str, endpoint: Optional[str]) -> bool:
    """Export this process's spans to an OTLP/gRPC collector; nothing (and no import) without an endpoint."""
    if not endpoint:
        return False
    try:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.error("--otlp-endpoint needs the OpenTelemetry SDK: pip install 'laya-grpc[otel]'; tracing stays off")
        return False
    insecure = not endpoint.startswith("https://")
    use(_new_provider(service, BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint, insecure=insecure))))
    return True


# Resource attributes read from the environment (set from the pod by the Kubernetes manifests).
_K8S_ENV = {"k8s.pod.name": "K8S_POD_NAME", "k8s.namespace.name": "K8S_NAMESPACE_NAME",
            "k8s.node.name": "K8S_NODE_NAME"}
# gRPC status codes that make a server span an error (the semantic conventions' list).
_GRPC_SERVER_ERRORS = {2, 4, 12, 13, 14, 15}


def resource_attributes(service: str) -> dict:
    """Who emits the spans: service, version, host, process, and the pod when running in one."""
    from laya_grpc import __version__
    attrs = {"service.name": "laya-" + service, "service.namespace": "laya", "service.version": __version__,
             "host.name": socket.gethostname(), "process.pid": os.getpid()}
    attrs.update({key: flags.external(var) for key, var in _K8S_ENV.items() if flags.external(var)})
    attrs["service.instance.id"] = attrs.get("k8s.pod.name", attrs["host.name"]) + ":%d" % attrs["process.pid"]
    return attrs


def _new_provider(service: str, processor):
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    provider = TracerProvider(resource=Resource.create(resource_attributes(service)))
    provider.add_span_processor(processor)
    return provider


def use(provider) -> None:
    """Trace through this SDK TracerProvider (setup's, or a test's with an in-memory exporter)."""
    global _tracer, _provider, _propagator
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    _provider, _propagator = provider, TraceContextTextMapPropagator()
    _tracer = provider.get_tracer("laya_grpc")


def shutdown() -> None:
    """Flush and stop (spans still buffered are sent); tracing is off afterwards."""
    global _tracer, _provider
    if _provider is not None:
        try:
            _provider.shutdown()
        except Exception:  # noqa: BLE001 - an unreachable collector must not fail a clean stop
            log.warning("could not flush traces to the collector")
    _tracer = _provider = None


def _parent(traceparent: str):
    return _propagator.extract({"traceparent": traceparent}) if traceparent else None


def _own(attributes: dict) -> dict:
    return {"laya." + k: v for k, v in attributes.items() if v is not None}


def operation_attributes(operation: str) -> dict:
    """The standard attributes a span name in the conventions' form stands for: `METHOD /route`
    (HTTP server) or `package.Service/Method` (RPC)."""
    method, sep, route = operation.partition(" ")
    if sep:
        return {"http.request.method": method, "http.route": route, "url.path": route}
    service, sep, method = operation.rpartition("/")
    if sep:
        return {"rpc.system": "grpc", "rpc.service": service, "rpc.method": method}
    return {}


def request_span(operation: str, traceparent: str = "", **attributes):
    """The gateway's span for one request, continuing the client's trace when it sent a traceparent.
    `operation` is `POST /v1/systemone` or `laya_proto.v1.DecisionService/Decide` (see
    operation_attributes); `finish_request` records the outcome."""
    if _tracer is None:
        return _NOOP
    from opentelemetry.trace import SpanKind
    # the status is finish_request's: a client's error that propagates is no server error
    return _tracer.start_as_current_span(operation, context=_parent(traceparent), kind=SpanKind.SERVER,
                                         attributes={**operation_attributes(operation), **_own(attributes)},
                                         record_exception=False, set_status_on_exception=False)


def finish_request(http_status: int, grpc_code: Optional[int], **attributes) -> None:
    """The current request span's outcome: `rpc.grpc.status_code` for a gRPC request (`grpc_code`),
    `http.response.status_code` otherwise, and an error status where the conventions say so
    (HTTP 5xx; the gRPC codes of a server fault)."""
    if _tracer is None:
        return
    from opentelemetry import trace
    from opentelemetry.trace import Status, StatusCode
    current = trace.get_current_span()
    if grpc_code is None:
        current.set_attribute("http.response.status_code", http_status)
        failed = http_status >= 500
    else:
        current.set_attribute("rpc.grpc.status_code", grpc_code)
        failed = grpc_code in _GRPC_SERVER_ERRORS
    current.set_attributes(_own(attributes))
    if failed:
        current.set_status(Status(StatusCode.ERROR))


def span(name: str, **attributes):
    """A child of the current span (no-op when tracing is off)."""
    if _tracer is None:
        return _NOOP
    return _tracer.start_as_current_span(name, attributes=_own(attributes))


def server_span(operation: str, traceparent: str, **attributes):
    """A service's span for an internal call (`laya_proto.v1.TokenizerService/Tokenize`), in the
    trace of the caller's traceparent."""
    if _tracer is None or not traceparent:
        return _NOOP
    from opentelemetry.trace import SpanKind
    return _tracer.start_as_current_span(operation, context=_parent(traceparent), kind=SpanKind.SERVER,
                                         attributes={**operation_attributes(operation), **_own(attributes)})


def traceparent() -> str:
    """The current span's W3C traceparent, to put in an internal call ('' when tracing is off)."""
    if _tracer is None:
        return ""
    carrier: dict = {}
    _propagator.inject(carrier)
    return carrier.get("traceparent", "")


def record_batched(traceparents: Iterable[str], call_start_ns: int, queue_ms: float, model_ms: float,
                   **attributes) -> None:
    """The inference service's part of each request's trace, once its forward pass is done:
    `laya_proto.v1.InferenceService/Infer` (the call) > `inference.queue` (waiting for the device) >
    `inference.forward` (the pass it shared; `attributes` say with how many rows and requests).
    Timestamps are the same in every request's trace."""
    if _tracer is None:
        return
    from opentelemetry import trace
    from opentelemetry.trace import SpanKind
    end_ns = time.time_ns()   # the reply follows the pass at once: time it back from here
    forward_start = max(call_start_ns, end_ns - int(model_ms * 1e6))
    queue_start = max(call_start_ns, forward_start - int(queue_ms * 1e6))
    call_attributes, attributes = operation_attributes(INFER), _own(attributes)
    for tp in traceparents:
        if not tp:
            continue
        call = _tracer.start_span(INFER, context=_parent(tp), kind=SpanKind.SERVER, start_time=call_start_ns,
                                  attributes=call_attributes)
        inside = trace.set_span_in_context(call)
        _tracer.start_span("inference.queue", context=inside, start_time=queue_start).end(end_time=forward_start)
        fwd = _tracer.start_span("inference.forward", context=inside, start_time=forward_start, attributes=attributes)
        fwd.end(end_time=end_ns)
        call.end(end_time=end_ns)
