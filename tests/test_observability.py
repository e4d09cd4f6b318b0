"""Request ids, access log, JSON logs, traces across the three processes, clean shutdown logs.

The trace test runs a real OTLP/gRPC collector in this process (the opentelemetry-proto service
stubs over a real socket) and points `serve --otlp-endpoint` at it, so it sees what an operator's
collector sees; the batched-forward recording is also checked with the SDK's in-memory exporter.
"""
from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from concurrent import futures

import grpc
import pytest

from stack import Stack, free_port

Q = {"u": {"type": "noul", "instructions": "Is this urgent?"}}
BODY = {"state": "my card was charged twice, please help", "questions": Q, "model": "english"}


def _json_lines(text: str) -> list:
    out = []
    for line in text.splitlines():
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


def test_request_ids_access_log_json_and_a_clean_stop(tiny_ckpt):
    with Stack({"english": tiny_ckpt}, extra_args=["--log-format", "json"]) as s:
        status, _, headers = s.post("/v1/systemone", BODY, headers={"x-request-id": "client-id-42"})
        assert status == 200 and headers["x-request-id"] == "client-id-42"
        status, _, headers = s.post("/v1/systemone", BODY)
        minted = headers["x-request-id"]
        assert status == 200 and re.fullmatch(r"[0-9a-f]{32}", minted)
        status, _, headers = s.post("/v1/systemone", {"state": "x", "questions": {"x": {"type": "zz"}}},
                                    headers={"x-request-id": "bad one with spaces"})
        assert status == 422 and re.fullmatch(r"[0-9a-f]{32}", headers["x-request-id"])   # replaced, not echoed
        bad_id = headers["x-request-id"]
        channel = grpc.insecure_channel(s.grpc)
        from laya_proto.v1 import decision_pb2, decision_pb2_grpc
        call = decision_pb2_grpc.DecisionServiceStub(channel).Decide.with_call(
            decision_pb2.DecideRequest(request_json=json.dumps(dict(BODY, state="hello"))),
            metadata=(("x-request-id", "grpc-id-7"),), timeout=30)
        assert dict(call[1].initial_metadata())["x-request-id"] == "grpc-id-7"
        channel.close()
        # a child that dies is restarted: serve forks while its own gRPC threads run (the C core
        # would print a fork_posix.cc line)
        os.kill(s.child_pid("tokenizer"), signal.SIGKILL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if "restart #1" in s.full_log() and s.health().get("ready") is True:
                break
            time.sleep(0.2)
        assert s.post("/v1/systemone", BODY)[0] == 200
    log = s.full_log()
    lines = _json_lines(log)
    # every line a child wrote is JSON (serve's own ready line is a plain print)
    stray = [ln for ln in log.splitlines() if ln.strip() and not ln.startswith("{") and "laya-grpc: ready" not in ln]
    assert not stray, stray[:10]
    access = {ln["request_id"]: ln for ln in lines if ln["logger"] == "laya_grpc.access"}
    a = access["client-id-42"]
    assert (a["api"], a["route"], a["status"], a["checkpoint"], a["service"]) == ("http", "decide", 200, "english", "gateway")
    assert a["ms"] > 0 and minted in access
    assert access[bad_id]["status"] == 422
    g = access["grpc-id-7"]
    assert (g["api"], g["route"], g["status"], g["checkpoint"]) == ("grpc", "decide", 200, "english")
    # a normal stop: no tracebacks, no raw gRPC C-core lines (E1203 12:00:00.000 ... or absl's preamble)
    assert "Traceback" not in log
    assert not re.search(r"^[EWID]\d{4} \d\d:\d\d:\d\d", log, re.M), log[-3000:]
    assert "absl::InitializeLog" not in log
    assert "restart #1" in log


def test_a_cancelled_grpc_handler_is_not_logged_as_an_error():
    """grpc.aio logs handlers cancelled by the server's stop as ERROR with a CancelledError
    traceback; the log set-up drops exactly those."""
    import asyncio
    import io
    import logging
    from laya_grpc.core.runtime import logs
    logs.setup("test", "text")
    buf = io.StringIO()
    logging.getLogger().handlers[0].stream = buf
    cy = logging.getLogger("grpc._cython.cygrpc")
    for exc in (asyncio.CancelledError(), ValueError("a real one")):
        try:
            raise exc
        except BaseException:
            cy.error("Exception not handled by _handle_exceptions in servicer method [/x/Y]", exc_info=True)
    assert "CancelledError" not in buf.getvalue() and "ValueError: a real one" in buf.getvalue()


# -- traces -------------------------------------------------------------------------------------
class _Collector:
    """An OTLP/gRPC trace receiver: what `--otlp-endpoint` talks to."""

    def __init__(self):
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
        self.spans, self.lock = [], threading.Lock()
        outer = self

        class Service(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request, context):
                with outer.lock:
                    for rs in request.resource_spans:
                        resource = {a.key: a.value for a in rs.resource.attributes}
                        svc = resource["service.name"].string_value
                        for ss in rs.scope_spans:
                            for sp in ss.spans:
                                attrs = {a.key: a.value for a in sp.attributes}
                                outer.spans.append({"service": svc, "name": sp.name, "trace": sp.trace_id.hex(),
                                                    "id": sp.span_id.hex(), "parent": sp.parent_span_id.hex(),
                                                    "start": sp.start_time_unix_nano, "end": sp.end_time_unix_nano,
                                                    "attrs": attrs, "resource": resource})
                return trace_service_pb2.ExportTraceServiceResponse()

        self.port = free_port()
        self.server = grpc.server(futures.ThreadPoolExecutor(4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), self.server)
        self.server.add_insecure_port("127.0.0.1:%d" % self.port)
        self.server.start()

    def trace(self, trace_id: str, names: set, timeout: float = 20.0) -> list:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                got = [s for s in self.spans if s["trace"] == trace_id]
            if names <= {s["name"] for s in got}:
                return got
            time.sleep(0.1)
        return got


ROOT_SPAN, TOKENIZE_SPAN, INFER_SPAN = ("POST /v1/systemone", "laya_proto.v1.TokenizerService/Tokenize",
                                        "laya_proto.v1.InferenceService/Infer")
HOPS = {ROOT_SPAN, "tokenize", TOKENIZE_SPAN, "infer", INFER_SPAN, "inference.queue", "inference.forward", "decode"}


def test_one_trace_shows_every_hop(tiny_ckpt):
    pytest.importorskip("opentelemetry.sdk")
    col = _Collector()
    try:
        with Stack({"english": tiny_ckpt}, extra_args=["--otlp-endpoint", "http://127.0.0.1:%d" % col.port],
                   env={"OTEL_BSP_SCHEDULE_DELAY": "100", "LAYA_MAX_CONCURRENT": "64",
                        "K8S_POD_NAME": "laya-pod-7"}) as s:
            trace_id = "0af7651916cd43dd8448eb211c80319c"
            parent = "b7ad6b7169203331"
            status, _, headers = s.post("/v1/systemone", BODY, headers={
                "traceparent": "00-%s-%s-01" % (trace_id, parent), "x-request-id": "traced-1"})
            assert status == 200
            spans = col.trace(trace_id, HOPS)
            by_name = {sp["name"]: sp for sp in spans}
            assert HOPS <= set(by_name), sorted(by_name)
            assert by_name[ROOT_SPAN]["parent"] == parent   # continues the client's trace
            root = by_name[ROOT_SPAN]["id"]
            for child in ("tokenize", "infer", "decode"):
                assert by_name[child]["parent"] == root
            assert by_name[TOKENIZE_SPAN]["parent"] == by_name["tokenize"]["id"]
            assert by_name[INFER_SPAN]["parent"] == by_name["infer"]["id"]
            for step in ("inference.queue", "inference.forward"):
                assert by_name[step]["parent"] == by_name[INFER_SPAN]["id"]
            assert by_name["inference.queue"]["end"] <= by_name["inference.forward"]["start"] + 1
            assert {by_name[n]["service"] for n in (ROOT_SPAN, TOKENIZE_SPAN, "inference.forward")} == \
                {"laya-gateway", "laya-tokenizer", "laya-inference"}
            # OpenTelemetry's semantic conventions, and the resource of every process
            attrs = by_name[ROOT_SPAN]["attrs"]
            assert attrs["laya.request_id"].string_value == "traced-1"
            assert (attrs["http.request.method"].string_value, attrs["http.route"].string_value,
                    attrs["http.response.status_code"].int_value) == ("POST", "/v1/systemone", 200)
            for name, service, method in ((TOKENIZE_SPAN, "laya_proto.v1.TokenizerService", "Tokenize"),
                                          (INFER_SPAN, "laya_proto.v1.InferenceService", "Infer")):
                a = by_name[name]["attrs"]
                assert (a["rpc.system"].string_value, a["rpc.service"].string_value, a["rpc.method"].string_value) \
                    == ("grpc", service, method)
            assert by_name["inference.forward"]["attrs"]["laya.checkpoint"].string_value == "english"
            from laya_grpc import __version__
            for sp in spans:
                res = sp["resource"]
                assert res["service.version"].string_value == __version__, sp["name"]
                assert res["k8s.pod.name"].string_value == "laya-pod-7", sp["name"]
                assert res["host.name"].string_value, sp["name"]

            # concurrent requests share Infer calls and forward passes: each trace still has its own
            # forward span (the pass recorded in every request's trace)
            ids = ["%032x" % (0xabc000 + i) for i in range(16)]
            with futures.ThreadPoolExecutor(16) as pool:
                list(pool.map(lambda t: s.post("/v1/systemone", BODY, headers={
                    "traceparent": "00-%s-%s-01" % (t, parent)}), ids))
            shared = 0
            for t in ids:
                got = col.trace(t, HOPS)
                assert HOPS <= {sp["name"] for sp in got}, (t, sorted(sp["name"] for sp in got))
                fwd = next(sp for sp in got if sp["name"] == "inference.forward")
                shared += fwd["attrs"]["laya.batch_rows"].int_value > 1
            print("requests whose forward pass was shared: %d of %d" % (shared, len(ids)))
    finally:
        col.server.stop(0)


def test_batched_forward_is_recorded_in_each_trace_in_memory():
    """The SDK's in-memory exporter: one forward pass for two requests appears in both traces."""
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from laya_grpc.core.runtime import tracing
    from laya_grpc.gateway import request_scope
    exporter = InMemorySpanExporter()
    tracing.use(tracing._new_provider("test", SimpleSpanProcessor(exporter)))
    try:
        parents = []
        for rid in ("r1", "r2"):
            with request_scope.observed("http", "decide", rid, operation="POST /v1/systemone"):
                with tracing.span("infer"):
                    parents.append(tracing.traceparent())
        assert len({p.split("-")[1] for p in parents}) == 2
        t0 = time.time_ns()
        tracing.record_batched(parents, t0, queue_ms=1.0, model_ms=2.0, batch_rows=6)
        spans = exporter.get_finished_spans()
        forwards = [sp for sp in spans if sp.name == "inference.forward"]
        assert len(forwards) == 2
        assert {sp.context.trace_id for sp in forwards} == \
            {sp.context.trace_id for sp in spans if sp.name == "POST /v1/systemone"}
        assert all(sp.attributes["laya.batch_rows"] == 6 for sp in forwards)
    finally:
        tracing.shutdown()
    assert not tracing.enabled() and tracing.traceparent() == ""


def test_request_span_outcome_follows_the_conventions_in_memory():
    """A gRPC request span carries rpc.* and rpc.grpc.status_code; only a server fault marks it an
    error (a client's bad request does not), as an HTTP 5xx does."""
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import StatusCode
    from laya_grpc.core.runtime import tracing
    from laya_grpc.gateway import request_scope
    from laya_grpc.core.errors import Kind, LayaError
    exporter = InMemorySpanExporter()
    tracing.use(tracing._new_provider("test", SimpleSpanProcessor(exporter)))
    try:
        for kind in (Kind.BAD_REQUEST, Kind.INTERNAL):
            with pytest.raises(LayaError):
                with request_scope.observed("grpc", "decide", operation="laya_proto.v1.DecisionService/Decide"):
                    raise LayaError(kind, "x")
        with request_scope.observed("http", "decide", operation="POST /v1/systemone") as scope:
            scope.status = 503
        bad, internal, busy = exporter.get_finished_spans()
        assert bad.name == "laya_proto.v1.DecisionService/Decide"
        assert (bad.attributes["rpc.system"], bad.attributes["rpc.service"], bad.attributes["rpc.method"]) == \
            ("grpc", "laya_proto.v1.DecisionService", "Decide")
        assert (bad.attributes["rpc.grpc.status_code"], bad.status.status_code) == (3, StatusCode.UNSET)
        assert (internal.attributes["rpc.grpc.status_code"], internal.status.status_code) == (13, StatusCode.ERROR)
        assert (busy.attributes["http.response.status_code"], busy.status.status_code) == (503, StatusCode.ERROR)
        assert "http.response.status_code" not in bad.attributes and "rpc.system" not in busy.attributes
    finally:
        tracing.shutdown()


def test_resource_names_the_pod(monkeypatch):
    from laya_grpc import __version__
    from laya_grpc.core.runtime import tracing
    monkeypatch.setenv("K8S_POD_NAME", "laya-inference-5d9f")
    monkeypatch.setenv("K8S_NAMESPACE_NAME", "laya")
    monkeypatch.delenv("K8S_NODE_NAME", raising=False)
    attrs = tracing.resource_attributes("inference")
    assert attrs["service.name"] == "laya-inference" and attrs["service.version"] == __version__
    assert (attrs["k8s.pod.name"], attrs["k8s.namespace.name"]) == ("laya-inference-5d9f", "laya")
    assert "k8s.node.name" not in attrs and attrs["host.name"]
    assert attrs["service.instance.id"].startswith("laya-inference-5d9f:")


def test_tracing_off_imports_no_sdk():
    """Without --otlp-endpoint the services never import the OpenTelemetry SDK (the `otel` extra)."""
    import subprocess
    import sys
    code = ("import sys; import laya_grpc.gateway.server, laya_grpc.tokenizer.server, laya_grpc.cli.serve; "
            "from laya_grpc.core.runtime import tracing; from laya_grpc.gateway import request_scope; "
            "tracing.setup('gateway', None)\n"
            "with request_scope.observed('http', 'decide'): pass\n"
            "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout
