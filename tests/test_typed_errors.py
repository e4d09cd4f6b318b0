"""Typed errors on the gRPC front: field paths and enum names, bounded details, an oversized
message answered TOO_LARGE without ending its stream, unknown models said, and cancelled calls
counted as what they are."""
from __future__ import annotations

import json
import re
import time
import urllib.request

import grpc
import httpx
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from laya_grpc.core.errors import Kind, LayaError
from laya_grpc.core.decisions.routing import RouteTable
from laya_grpc.gateway.http_body import parse_decide_body
from laya_proto.v1 import decision_pb2, decision_pb2_grpc
from stack import Stack, free_port

D = decision_pb2
NOUL = {"type": "noul", "instructions": "Is the customer angry?"}


@pytest.fixture(scope="module")
def stack(tiny_ckpt, tiny_ml_ckpt):
    port = free_port()
    with Stack({"english": tiny_ckpt, "multilingual": tiny_ml_ckpt},
               extra_args=["--metrics", "127.0.0.1:%d" % port]) as s:
        s.metrics_port = port
        s.channel = grpc.insecure_channel(s.grpc)
        s.stub = decision_pb2_grpc.DecisionServiceStub(s.channel)
        yield s
        s.channel.close()


def _violation(e: grpc.RpcError):
    st = rpc_status.from_call(e)
    for d in st.details:
        if d.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            br = error_details_pb2.BadRequest()
            d.Unpack(br)
            return br.field_violations[0]
    return None


def _q(**kw):
    kw.setdefault("id", "q")
    kw.setdefault("instructions_text", "Is it?")
    return D.Question(**kw)


def _state(text="My phone arrived broken."):
    return D.StateValue(text=text)


@pytest.mark.parametrize("req, field, text", [
    (D.DecideRequest(state=_state(), questions=[_q(type=99)]), 'questions["q"].type',
     "unknown type 99; use one of QUESTION_TYPE_CHOICE, QUESTION_TYPE_SCORE, QUESTION_TYPE_NOUL"),
    (D.DecideRequest(state=_state(), questions=[_q()]), 'questions["q"].type', "has no type"),
    (D.DecideRequest(state=_state(), questions=[_q(type=D.QUESTION_TYPE_CHOICE)]), 'questions["q"].criteria',
     "a choice question takes 'criteria'"),
    (D.DecideRequest(state=_state(), questions=[_q(type=D.QUESTION_TYPE_NOUL, instructions_text="")]),
     'questions["q"].instructions', "'instructions' must not be empty"),
    (D.DecideRequest(questions=[_q(type=D.QUESTION_TYPE_NOUL)]), "state", "'state' is required"),
    (D.DecideRequest(state=_state(), questions=[_q(type=D.QUESTION_TYPE_NOUL)], max_len=10**6), "max_len", "exceeds server limit"),
    (D.DecideRequest(state=_state(), questions=[_q(type=D.QUESTION_TYPE_NOUL)], task="bogus"), "task", "bogus"),
    (D.DecideRequest(state=_state(), questions=[_q(type=D.QUESTION_TYPE_NOUL)],
                     min_confidence_buckets=D.ConfidenceBuckets(thresholds={"score": 0.5})),
     "min_confidence", "min_confidence map keys"),
], ids=["enum-99", "enum-unset", "choice-no-criteria", "empty-instructions", "no-state", "max-len", "task",
        "bucket-key"])
def test_invalid_argument_names_the_field_path(stack, req, field, text):
    with pytest.raises(grpc.RpcError) as e:
        stack.stub.Decide(req, timeout=30)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value
    assert text in e.value.details()
    v = _violation(e.value)
    assert v is not None and v.field == field, (v, e.value.details())


def test_a_stream_call_error_carries_the_full_status(stack):
    """DecideStream answers each failed call with the google.rpc.Status `Decide` would give: the
    code, and the BadRequest naming the field path."""
    from google.rpc import error_details_pb2, status_pb2
    bad = D.DecideRequest(state=_state(), questions=[_q(type=99)])
    [reply] = list(stack.stub.DecideStream(iter([D.DecideCall(id=1, request=bad)]), timeout=60))
    assert reply.WhichOneof("result") == "error" and reply.error.kind == "INVALID"
    st = status_pb2.Status.FromString(reply.error.status)
    assert st.code == grpc.StatusCode.INVALID_ARGUMENT.value[0] and "unknown type 99" in st.message
    fields = []
    for d in st.details:
        if d.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            br = error_details_pb2.BadRequest()
            d.Unpack(br)
            fields += [v.field for v in br.field_violations]
    assert fields == ['questions["q"].type'], st


@pytest.mark.parametrize("where", ["task", "model", "question id"])
@pytest.mark.parametrize("n", [3000, 20000])
def test_long_client_values_give_a_bounded_invalid_argument(stack, where, n):
    """A detail that echoes a 20,000-char value is clipped: INVALID_ARGUMENT (or the auto-routed
    answer for an unknown model), never RESOURCE_EXHAUSTED from oversize metadata."""
    long = "x" * n
    req = D.DecideRequest(state=_state(), questions=[_q(type=D.QUESTION_TYPE_NOUL)])
    if where == "task":
        req.task = long
    elif where == "model":
        req.model = "./" + long             # a path: refused with upstream's text, which echoes it
    else:
        req.questions[0].id = long
        req.questions[0].instructions_text = ""
    with pytest.raises(grpc.RpcError) as e:
        stack.stub.Decide(req, timeout=30)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (e.value.code(), e.value.details()[:200])
    assert len(e.value.details()) < 1200


def test_an_oversized_message_is_too_large_and_the_stream_goes_on(stack):
    """5 MiB: over the 2 MiB body cap, under the receive limit: the typed TOO_LARGE, on Decide
    and as one DecideStream call's reply, and the calls after it are answered."""
    big = D.DecideRequest(state=_state("x" * (5 * 1024 * 1024)), questions=[_q(type=D.QUESTION_TYPE_NOUL)])
    with pytest.raises(grpc.RpcError) as e:
        stack.stub.Decide(big, timeout=30)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and e.value.details() == "request body too large"
    small = D.DecideRequest(state=_state(), questions=[_q(type=D.QUESTION_TYPE_NOUL)])
    replies = list(stack.stub.DecideStream(iter([D.DecideCall(id=1, request=big), D.DecideCall(id=2, request=small)]),
                                           timeout=60))
    by_id = {r.id: r for r in replies}
    assert by_id[1].WhichOneof("result") == "error" and by_id[1].error.kind == "TOO_LARGE"
    assert by_id[2].WhichOneof("result") == "response"


def test_calls_reusing_an_id_in_flight_are_each_answered(stack):
    """Two valid calls then an invalid one (answered at once), all with id 7: every call gets its
    reply and none is lost when the stream ends. A call that reuses the id of one in flight is
    refused as its own reply; one that comes after the first was answered is answered itself.
    Which happens depends on how fast each call runs."""
    small = D.DecideRequest(state=_state(), questions=[_q(type=D.QUESTION_TYPE_NOUL)])
    bad = D.DecideRequest(state=_state(), questions=[_q(type=99)])
    calls = [D.DecideCall(id=7, request=r) for r in (small, small, bad)]
    replies = list(stack.stub.DecideStream(iter(calls), timeout=60))
    assert len(replies) == 3 and all(r.id == 7 for r in replies), replies
    kinds = sorted(r.WhichOneof("result") for r in replies)
    assert kinds in (["error", "error", "response"], ["error", "response", "response"]), replies
    # a reused id is refused as BAD_REQUEST; the invalid question, when it reaches no call in flight
    # with its id, gets its own INVALID
    assert all(r.error.kind in ("BAD_REQUEST", "INVALID") for r in replies if r.HasField("error")), replies
    assert any(r.error.kind == "BAD_REQUEST" and "already in flight" in r.error.detail
               or r.error.kind == "INVALID" and "type 99" in r.error.detail for r in replies), replies


def test_an_unknown_model_is_said_and_still_answered(stack):
    """Upstream auto-routes it and the answer stays upstream's (routing.reason included, on both
    transports); the HTTP header and the gRPC trailing metadata name it."""
    body = {"state": "My phone arrived broken.", "questions": {"q": NOUL}, "model": "englsh"}
    r = httpx.post(stack.http + "/v1/systemone", json=body, timeout=30)
    assert r.status_code == 200 and r.headers["x-laya-unknown-model"] == "englsh"
    assert "englsh" not in r.json()["routing"]["reason"]
    assert "x-laya-unknown-model" not in httpx.post(stack.http + "/v1/systemone", json=dict(body, model="english"),
                                                    timeout=30).headers
    resp, call = stack.stub.Decide.with_call(D.DecideRequest(state=_state(), model="englsh",
                                                             questions=[_q(type=D.QUESTION_TYPE_NOUL)]), timeout=30)
    assert "englsh" not in resp.routing.reason
    assert dict(call.trailing_metadata())["laya-unknown-model"] == "englsh"


def test_strict_model_refuses_an_unknown_model():
    table = RouteTable.build({}, None, strict_model=True)
    with pytest.raises(LayaError) as e:
        parse_decide_body(json.dumps({"state": "x", "questions": {}, "model": "englsh"}).encode(), table)
    assert e.value.kind is Kind.NOT_FOUND and e.value.field == "model" and "englsh" in e.value.detail
    assert (e.value.kind.http_status, e.value.kind.grpc_code) == (404, grpc.StatusCode.NOT_FOUND)
    assert parse_decide_body(json.dumps({"state": "x", "questions": {}, "model": "english"}).encode(),
                             table).controls.model == "english"


def _metrics(stack) -> str:
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % stack.metrics_port, timeout=5) as r:
        return r.read().decode()


def _infer_calls(stack) -> float:
    return sum(float(v) for v in re.findall(r'laya_inference_calls_total\{[^}]*\} (\S+)', _metrics(stack)))


def _until(ready, seconds: float = 30.0):
    """Polls `ready()` until it returns something true or the time is up; its last value."""
    give_up = time.monotonic() + seconds
    while not (value := ready()) and time.monotonic() < give_up:
        time.sleep(0.05)
    return value


def _counts(stack) -> dict:
    text = _metrics(stack)
    out: dict = {}
    for m in re.finditer(r'laya_gateway_requests_total\{api="grpc",route="(\w+)",status="(\d+)"\} (\S+)', text):
        out[(m.group(1), m.group(2))] = out.get((m.group(1), m.group(2)), 0) + float(m.group(3))
    return out


def test_cancelled_and_expired_calls_are_not_counted_as_500(stack):
    """A batch whose deadline passes is DEADLINE_EXCEEDED (504 in the metrics), a call its client
    cancels CANCELLED (499); neither is a 500, and the gateway logs no traceback for them."""
    heavy = D.DecideBatchRequest(states=[_state("state %d" % i) for i in range(64)],
                                 questions=[_q(id="q%d" % j, type=D.QUESTION_TYPE_NOUL) for j in range(16)])
    with pytest.raises(grpc.RpcError) as e:
        stack.stub.DecideBatch(heavy, timeout=0.3)
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    before = _infer_calls(stack)
    fut = stack.stub.DecideBatch.future(heavy, timeout=30)
    assert _until(lambda: _infer_calls(stack) > before), "the batch never reached the inference service"
    assert fut.cancel(), "the batch ended before its cancel"   # 16 forwards of 64 rows: it is mid-way

    def counted(c: dict) -> bool:
        return c.get(("batch", "504"), 0) >= 1 and c.get(("batch", "499"), 0) >= 1
    _until(lambda: counted(_counts(stack)))   # a loaded box may take a while: wait for the outcome, not a time
    counts = _counts(stack)
    assert counts.get(("batch", "500"), 0) == 0, counts
    assert counted(counts), counts
    assert "Traceback" not in stack.full_log()


def test_a_huge_model_name_costs_one_short_log_line(stack):
    """A 2 MB `model` is auto-routed (upstream's answer); its warning line is clipped."""
    before = len(stack.full_log())
    body = {"state": "My phone arrived broken.", "questions": {"q": NOUL}, "model": "m" * 2_000_000}
    r = httpx.post(stack.http + "/v1/systemone", json=body, timeout=60)
    assert r.status_code == 200 and len(r.headers["x-laya-unknown-model"]) < 300
    time.sleep(0.5)
    new = stack.full_log()[before:]
    assert "unknown model" in new and max(len(line) for line in new.splitlines()) < 5000


def test_an_aborted_stream_leaves_no_traceback(stack):
    """Valid calls, then bytes that are no DecideCall: the stream ends INVALID_ARGUMENT, and the
    calls in flight end quietly (no 'Task exception was never retrieved', no 500s)."""
    call = stack.channel.stream_stream("/laya_proto.v1.DecisionService/DecideStream",
                                       request_serializer=lambda b: b, response_deserializer=D.DecideReply.FromString)
    batch = D.DecideRequest(state=_state(), questions=[_q(id="q%d" % j, type=D.QUESTION_TYPE_NOUL) for j in range(32)])
    frames = [D.DecideCall(id=i, request=batch).SerializeToString() for i in range(1, 6)] + [b"\xff\xff\xff"]
    before = len(stack.full_log())
    with pytest.raises(grpc.RpcError) as e:
        list(call(iter(frames), timeout=60))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    time.sleep(2.0)
    new = stack.full_log()[before:]
    assert "never retrieved" not in new and "AbortError" not in new and "Traceback" not in new, new[-3000:]
    assert " 500 " not in new, new[-3000:]


def test_an_undecodable_frame_while_a_reply_is_written_still_ends_the_stream():
    """serve_calls on a real grpc.aio server whose calls answer at once: the undecodable frame's
    INVALID_ARGUMENT goes out while the first reply is being written. Both would carry the
    stream's headers unless they were sent first; gRPC's core then refused the status, and the
    client waited for its deadline (18 of 20 streams on the 2-core CI box)."""
    import asyncio

    from laya_grpc.core.wire import calls, rpc
    from laya_proto.v1 import tokens_pb2

    class Echo(decision_pb2_grpc.DecisionServiceServicer):
        async def DecideStream(self, requests, context):
            async def answer(request):
                return D.DecideResponse(model="m")
            await calls.serve_calls(requests, context, answer, D.DecideReply, tokens_pb2.CallError, "Decide", 128)

    async def main():
        srv = rpc.server()
        decision_pb2_grpc.add_DecisionServiceServicer_to_server(Echo(), srv)
        port = srv.add_insecure_port("127.0.0.1:0")
        await srv.start()
        codes = []
        try:
            async with grpc.aio.insecure_channel("127.0.0.1:%d" % port) as ch:
                call = ch.stream_stream("/laya_proto.v1.DecisionService/DecideStream",
                                        request_serializer=lambda b: b,
                                        response_deserializer=D.DecideReply.FromString)
                frames = [D.DecideCall(id=1, request=D.DecideRequest()).SerializeToString(), b"\xff\xff\xff"]
                for _ in range(20):
                    try:
                        async for _reply in call(iter(frames), timeout=10):
                            pass
                        codes.append(grpc.StatusCode.OK)
                    except grpc.aio.AioRpcError as e:
                        codes.append(e.code())
                    if codes[-1] != grpc.StatusCode.INVALID_ARGUMENT:
                        break
        finally:
            await srv.stop(0)
        return codes

    codes = asyncio.run(main())
    assert codes == [grpc.StatusCode.INVALID_ARGUMENT] * 20, codes


def test_a_status_for_a_call_that_already_ended_ends_it_as_cancelled(caplog):
    """When a deadline and an error answer meet in the same instant, gRPC's core refuses the status
    batch; the handler then ends as cancelled (debug log) instead of raising the core's error,
    which grpc logs with a traceback at ERROR. A batch the core refuses to start is our bug: a
    warning."""
    import asyncio
    import logging

    from laya_grpc.core.wire import rpc

    class EndedCall:
        async def abort(self, code, details, trailing_metadata=()):
            raise RuntimeError('Failed "execute_batch": (SendStatusFromServerOperation,)')

    class LiveCall:
        async def abort(self, code, details, trailing_metadata=()):
            raise grpc.aio.AbortError()

    class RefusedBatch:
        async def abort(self, code, details, trailing_metadata=()):
            raise RuntimeError("Failed grpc_call_start_batch: 8 with grpc_call_error value: "
                               "'GRPC_CALL_ERROR_TOO_MANY_OPERATIONS'")

    with caplog.at_level(logging.DEBUG, logger="laya_grpc.core.wire.rpc"):
        with pytest.raises(asyncio.CancelledError):
            asyncio.run(rpc.abort(EndedCall(), LayaError(Kind.BUSY, "server busy")))
        assert [r.levelno for r in caplog.records] == [logging.DEBUG]
        with pytest.raises(asyncio.CancelledError):
            asyncio.run(rpc.abort(RefusedBatch(), LayaError(Kind.BAD_REQUEST, "bad")))
        assert [r.levelno for r in caplog.records] == [logging.DEBUG, logging.WARNING]
    with pytest.raises(grpc.aio.AbortError):
        asyncio.run(rpc.abort(LiveCall(), LayaError(Kind.BUSY, "server busy")))
