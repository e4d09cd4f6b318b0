"""OpenTelemetry tracing, off unless `--otlp-endpoint` is set (env LAYA_OTLP_ENDPOINT).

One trace per request: the gateway's request span (a child of the client's `traceparent` when it
sent one) holds `tokenize`, `infer` and `decode`; the tokenizer and inference services continue
the trace from the W3C traceparent carried in each internal call's `CallOrigin` (calls share
long-lived streams, so there is no per-call metadata to carry it). The inference batcher runs one
forward pass for many requests: the inference service records that pass in *each* request's
trace (`inference.queue` then `inference.forward`, same timestamps in every trace, attributes
saying how many rows and requests shared it), so one trace shows every hop of its request.

opentelemetry-sdk and the OTLP exporter are the `otel` extra and are imported only when tracing
is enabled; with it off every helper here is a constant no-op (no per-request work).
"""
from __future__ import annotations

import contextlib
import logging
import time
from typing import Iterable, Optional

log = logging.getLogger("laya_grpc.core.tracing")

_NOOP = contextlib.nullcontext()
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


def _new_provider(service: str, processor):
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    provider = TracerProvider(resource=Resource.create({"service.name": "laya-" + service}))
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


def request_span(name: str, traceparent: str = "", **attributes):
    """The gateway's span for one request, continuing the client's trace when it sent a traceparent."""
    if _tracer is None:
        return _NOOP
    from opentelemetry.trace import SpanKind
    return _tracer.start_as_current_span(name, context=_parent(traceparent), kind=SpanKind.SERVER,
                                         attributes=attributes)


def span(name: str, **attributes):
    """A child of the current span (no-op when tracing is off)."""
    if _tracer is None:
        return _NOOP
    return _tracer.start_as_current_span(name, attributes=attributes)


def server_span(name: str, traceparent: str, **attributes):
    """A service's span for an internal call, in the trace of the caller's traceparent."""
    if _tracer is None or not traceparent:
        return _NOOP
    from opentelemetry.trace import SpanKind
    return _tracer.start_as_current_span(name, context=_parent(traceparent), kind=SpanKind.SERVER,
                                         attributes=attributes)


def traceparent() -> str:
    """The current span's W3C traceparent, to put in an internal call ('' when tracing is off)."""
    if _tracer is None:
        return ""
    carrier: dict = {}
    _propagator.inject(carrier)
    return carrier.get("traceparent", "")


def set_attributes(**attributes) -> None:
    if _tracer is None:
        return
    from opentelemetry import trace
    trace.get_current_span().set_attributes(attributes)


def record_batched(traceparents: Iterable[str], call_start_ns: int, queue_ms: float, model_ms: float,
                   **attributes) -> None:
    """The inference service's part of each request's trace, once its forward pass is done:
    `inference.infer` (the call) > `inference.queue` (waiting for the device) > `inference.forward`
    (the pass it shared; `attributes` say with how many rows and requests). Timestamps are the
    same in every request's trace."""
    if _tracer is None:
        return
    from opentelemetry import trace
    from opentelemetry.trace import SpanKind
    end_ns = time.time_ns()   # the reply follows the pass at once: time it back from here
    forward_start = max(call_start_ns, end_ns - int(model_ms * 1e6))
    queue_start = max(call_start_ns, forward_start - int(queue_ms * 1e6))
    for tp in traceparents:
        if not tp:
            continue
        call = _tracer.start_span("inference.infer", context=_parent(tp), kind=SpanKind.SERVER,
                                  start_time=call_start_ns)
        inside = trace.set_span_in_context(call)
        _tracer.start_span("inference.queue", context=inside, start_time=queue_start).end(end_time=forward_start)
        fwd = _tracer.start_span("inference.forward", context=inside, start_time=forward_start, attributes=attributes)
        fwd.end(end_time=end_ns)
        call.end(end_time=end_ns)
