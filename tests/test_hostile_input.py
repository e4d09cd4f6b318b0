"""Hostile clients on the real stack (key set): malformed input on both transports gets a 4xx or
a non-INTERNAL/UNKNOWN status with no traceback in the log, the service answers a valid request
correctly afterwards; auth covers everything but the probes; one admission limit for both
transports; slow or silent HTTP clients are dropped at the header timeout.

Counts are small for CI; `pytest --soak` runs the targets' counts (2,000 HTTP, 1,000 gRPC)."""
from __future__ import annotations

import json
import socket
import time

from google.rpc import error_details_pb2
import grpc
from grpc_status import rpc_status
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from hypothesis import HealthCheck, given, settings

from hostile_clients import (BAD_CODES, PUBLIC_METHODS, SMALL, grpc_batch_requests, grpc_decide_requests,
                             http_bodies, open_until_closed, raw_call)
from laya_proto.v1 import decision_pb2, decision_pb2_grpc, status_pb2
from stack import Stack

KEY = "hostile-test-key"
AUTH = {"authorization": "Bearer " + KEY}
MD = (("authorization", "Bearer " + KEY),)
HEADER_TIMEOUT_S = 1.0


@pytest.fixture(scope="module")
def stack(tiny_ckpt):
    env = {"LAYA_API_KEY": KEY, "LAYA_MAX_CONCURRENT": "2", "LAYA_QUEUE_TIMEOUT_SECONDS": "0.5",
           "LAYA_HTTP_HEADER_TIMEOUT_SECONDS": str(HEADER_TIMEOUT_S), "LAYA_BODY_READ_TIMEOUT": "3"}
    with Stack({"english": tiny_ckpt}, env=env) as s:
        s.channel = grpc.insecure_channel(s.grpc)
        s.client = httpx.Client(timeout=60)
        s.expected = s.client.post(s.http + "/v1/systemone", json=SMALL, headers=AUTH).json()
        yield s
        s.client.close()
        s.channel.close()


def _still_right(stack) -> None:
    r = stack.client.post(stack.http + "/v1/systemone", json=SMALL, headers=AUTH)
    assert r.status_code == 200 and r.json()["answers"] == stack.expected["answers"]
    resp = decision_pb2_grpc.DecisionServiceStub(stack.channel).Decide(
        decision_pb2.DecideRequest(request_json=json.dumps(SMALL), include_json=True), metadata=MD, timeout=30)
    assert json.loads(resp.json)["answers"] == stack.expected["answers"]


def _no_tracebacks(stack) -> None:
    log = stack.full_log()
    assert "Traceback" not in log and "Exception in ASGI application" not in log, log[-3000:]


def test_undecodable_protobuf_is_invalid_argument_on_every_method(stack):
    for method, req_stream, resp_stream in PUBLIC_METHODS:
        code = raw_call(stack.channel, method, req_stream, resp_stream, b"\xff\xff\xff\xff garbage", metadata=MD)
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (method, code)
    _no_tracebacks(stack)
    _still_right(stack)


DEEP = "[" * 1200 + "]" * 1200


@pytest.mark.parametrize("field,value", [("state", DEEP), ("state", '"\\ud800"'),
                                         ("instructions_json", DEEP), ("instructions_json", '"\\udfff"'),
                                         ("request_json", DEEP), ("request_json", '["\\ud800", "b"]')])
def test_malformed_json_fields_are_invalid_argument_on_every_rpc(stack, field, value):
    q = decision_pb2.Question(id="q", type=decision_pb2.QUESTION_TYPE_NOUL, instructions_text="pick")
    if field == "instructions_json":
        q.instructions_json = value
    if field == "request_json":
        req = decision_pb2.DecideRequest(request_json='{"state": %s, "questions": {"q": {"type": "noul", '
                                                      '"instructions": "x"}}}' % value)
        batch = decision_pb2.DecideBatchRequest(request_json='{"states": [%s], "questions": {"q": {"type": '
                                                             '"noul", "instructions": "x"}}}' % value)
    else:
        state = decision_pb2.StateValue(json=value) if field == "state" else decision_pb2.StateValue(text="hello")
        req = decision_pb2.DecideRequest(state=state, model="english", questions=[q])
        batch = decision_pb2.DecideBatchRequest(states=[state], model="english", questions=[q])
    stub = decision_pb2_grpc.DecisionServiceStub(stack.channel)
    with pytest.raises(grpc.RpcError) as e:
        stub.Decide(req, metadata=MD, timeout=30)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
    with pytest.raises(grpc.RpcError) as e:
        stub.DecideBatch(batch, metadata=MD, timeout=30)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
    [reply] = list(stub.DecideStream(iter([decision_pb2.DecideCall(id=7, request=req)]), metadata=MD, timeout=30))
    assert reply.id == 7 and reply.WhichOneof("result") == "error" and reply.error.kind == "BAD_REQUEST", reply
    _no_tracebacks(stack)


def test_auth_covers_everything_but_the_probes(stack):
    status = decision_pb2_grpc.StatusServiceStub(stack.channel)
    for call in (lambda md: status.GetStatus(status_pb2.StatusRequest(), metadata=md, timeout=10),
                 lambda md: next(iter(status.Watch(status_pb2.StatusRequest(), metadata=md, timeout=10))),
                 lambda md: next(iter(reflection_pb2_grpc.ServerReflectionStub(stack.channel).ServerReflectionInfo(
                     iter([reflection_pb2.ServerReflectionRequest(list_services="")]), metadata=md, timeout=10)))):
        for md in (None, (("authorization", "Bearer wrong"),)):
            with pytest.raises(grpc.RpcError) as e:
                call(md)
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert call(MD) is not None            # with the key they answer
    health = health_pb2_grpc.HealthStub(stack.channel)
    assert health.Check(health_pb2.HealthCheckRequest(), timeout=10).status == health_pb2.HealthCheckResponse.SERVING
    assert stack.client.get(stack.http + "/health").json() == {"status": "ok"}
    assert "checkpoints" in stack.client.get(stack.http + "/health", headers=AUTH).json()


def test_grpc_and_http_share_one_admission_limit(stack):
    """LAYA_MAX_CONCURRENT=2: two HTTP requests stalled in their body hold both slots; after the
    queue time (0.5 s) gRPC is refused with UNAVAILABLE and a retry hint, and served again once they go."""
    host, port = stack.http[len("http://"):].split(":")
    holders = []
    for _ in range(2):
        s = socket.create_connection((host, int(port)))
        s.sendall(b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
                  b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{" % KEY.encode())
        holders.append(s)
    time.sleep(0.5)
    stub = decision_pb2_grpc.DecisionServiceStub(stack.channel)
    try:
        with pytest.raises(grpc.RpcError) as e:
            stub.Decide(decision_pb2.DecideRequest(request_json=json.dumps(SMALL), include_json=True), metadata=MD, timeout=10)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        assert dict(e.value.trailing_metadata()).get("retry-after") == "1"
        details = rpc_status.from_call(e.value).details
        assert any(d.Is(error_details_pb2.RetryInfo.DESCRIPTOR) for d in details), details
        r = stack.client.post(stack.http + "/v1/systemone", json=SMALL, headers=AUTH)
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        # each DecideStream call takes a slot too: refused as its own reply, the stream stays open
        calls = [decision_pb2.DecideCall(id=1, request=decision_pb2.DecideRequest(request_json=json.dumps(SMALL)))]
        replies = list(stub.DecideStream(iter(calls), metadata=MD, timeout=10))
        assert len(replies) == 1 and replies[0].WhichOneof("result") == "error", replies
        assert replies[0].error.kind == "BUSY", replies[0].error
    finally:
        for s in holders:
            s.close()
    time.sleep(0.3)
    _still_right(stack)


@pytest.mark.parametrize("send,drip_s", [(b"", 0.0), (b"POST /v1/systemone HTTP/1.1\r\n", 0.0),
                                         (b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200, 0.5)],
                         ids=["silent", "request-line-only", "headers-2-bytes-per-s"])
def test_slow_clients_are_dropped_at_the_header_timeout(stack, send, drip_s):
    host, port = stack.http[len("http://"):].split(":")
    lived = open_until_closed(host, int(port), send, drip_s, limit_s=15.0)
    assert lived < HEADER_TIMEOUT_S + 1.5, "connection lived %.1f s past a %.1f s header timeout" % (
        lived, HEADER_TIMEOUT_S)
    _still_right(stack)


def test_fuzzed_http_never_5xx(stack, soak):
    @settings(max_examples=2000 if soak else 120, deadline=None, derandomize=not soak,
              suppress_health_check=list(HealthCheck))
    @given(body=http_bodies)
    def one(body):
        for route in ("/v1/systemone", "/v1/systemone/batch"):
            r = stack.client.post(stack.http + route, content=body, headers=dict(AUTH, **{"content-type": "application/json"}))
            assert r.status_code < 500, (route, body[:200], r.status_code, r.text[:300])
            if r.status_code >= 400:
                assert isinstance(r.json().get("detail"), (str, list))
    one()
    _no_tracebacks(stack)
    _still_right(stack)


def test_fuzzed_grpc_never_internal(stack, soak):
    stub = decision_pb2_grpc.DecisionServiceStub(stack.channel)

    @settings(max_examples=1000 if soak else 80, deadline=None, derandomize=not soak,
              suppress_health_check=list(HealthCheck))
    @given(req=grpc_decide_requests(), batch=grpc_batch_requests())
    def one(req, batch):
        for call, msg in ((stub.Decide, req), (stub.DecideBatch, batch)):
            try:
                call(msg, metadata=MD, timeout=30)
            except grpc.RpcError as e:
                assert e.code() not in BAD_CODES, (msg, e.code(), e.details())
        [reply] = list(stub.DecideStream(iter([decision_pb2.DecideCall(id=1, request=req)]), metadata=MD, timeout=30))
        assert reply.WhichOneof("result") == "response" or reply.error.kind != "INTERNAL", (req, reply)
    one()
    _no_tracebacks(stack)
    _still_right(stack)
