"""The gRPC twin of the HTTP contract: every probe of tests/test_http_contract.py that can be
expressed as a gRPC request (`request_json` is a protobuf string, so the body must be UTF-8),
sent to `DecisionService` on the real stack, must give the same answer as the HTTP route of the
same stack (itself checked against upstream): 200 -> `json` equal to the HTTP body; an error ->
the gRPC code of the HTTP status, the same message, and the HTTP kind in the trailing metadata.
Auth on and off."""
from __future__ import annotations

import json

import grpc
import httpx
import pytest

from laya_grpc.core.errors import KIND_METADATA_KEY, Kind
from laya_proto.v1 import decision_pb2, decision_pb2_grpc
from stack import Stack
from test_http_contract import BATCH, ERRORS, HAPPY, KEY, _encode

KIND_BY_HTTP = {k.http_status: k for k in Kind if k.http_status != 500}


@pytest.fixture(scope="module", params=[None, KEY], ids=["auth-off", "auth-on"])
def stack(request, tiny_ckpt, tiny_ml_ckpt):
    env = {"LAYA_API_KEY": request.param} if request.param else {}
    with Stack({"english": tiny_ckpt, "multilingual": tiny_ml_ckpt, "typed-decisions": tiny_ckpt}, env=env) as s:
        s.key = request.param
        s.channel = grpc.insecure_channel(s.grpc)
        yield s
        s.channel.close()


def _utf8(raw: bytes):
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _check(stack, route: str, raw: bytes) -> None:
    text = _utf8(raw)
    if text is None:
        pytest.skip("not UTF-8: cannot travel in a protobuf string")
    if text == "":
        pytest.skip("an empty request_json is an unset field in proto3 (the typed form then applies)")
    headers = {"authorization": "Bearer " + stack.key} if stack.key else {}
    http = httpx.post(stack.http + route, content=raw, headers=headers, timeout=60)
    stub = decision_pb2_grpc.DecisionServiceStub(stack.channel)
    md = (("authorization", "Bearer " + stack.key),) if stack.key else None
    if route.endswith("batch"):
        call, req = stub.DecideBatch, decision_pb2.DecideBatchRequest(request_json=text)
    else:
        call, req = stub.Decide, decision_pb2.DecideRequest(request_json=text)
    try:
        resp = call(req, metadata=md, timeout=60)
    except grpc.RpcError as e:
        assert http.status_code != 200, "gRPC failed (%s: %s) where HTTP answered 200" % (e.code(), e.details())
        kind = KIND_BY_HTTP[http.status_code]
        assert e.code() == kind.grpc_code
        assert e.details() == http.json()["detail"]
        assert dict(e.trailing_metadata())[KIND_METADATA_KEY] == kind.name
        return
    assert http.status_code == 200, "gRPC answered where HTTP gave %d %s" % (http.status_code, http.text)
    assert json.loads(resp.json) == http.json()


@pytest.mark.parametrize("name", sorted(HAPPY))
def test_answers(stack, name):
    _check(stack, "/v1/systemone", _encode(HAPPY[name]))


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_errors(stack, name):
    _check(stack, "/v1/systemone", _encode(ERRORS[name]))


@pytest.mark.parametrize("name", sorted(BATCH))
def test_batch(stack, name):
    _check(stack, "/v1/systemone/batch", _encode(BATCH[name]))


def test_auth(stack):
    if not stack.key:
        pytest.skip("auth off")
    stub = decision_pb2_grpc.DecisionServiceStub(stack.channel)
    req = decision_pb2.DecideRequest(request_json=json.dumps({"state": "x", "questions": {}}))
    for md in (None, (("authorization", "Bearer wrong"),), (("authorization", "bearer " + KEY),)):
        with pytest.raises(grpc.RpcError) as e:
            stub.Decide(req, metadata=md, timeout=10)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert e.value.details() == "invalid or missing bearer token"
    assert stub.Decide(req, metadata=(("authorization", "Bearer " + KEY),), timeout=10).json


def test_typed_request_fields_equal_request_json(stack):
    """The typed form of a request answers exactly like the same body sent as request_json."""
    md = (("authorization", "Bearer " + stack.key),) if stack.key else None
    stub = decision_pb2_grpc.DecisionServiceStub(stack.channel)
    typed = decision_pb2.DecideRequest(text="I was charged twice, refund please.", model="english", max_len=64,
                                       min_confidence_json="0.5")
    typed.questions.add(id="c", type="choice", instructions="Which?", criteria_json='[1, 2.5, "x"]',
                        option_order=[2, 0, 1])
    typed.questions.add(id="n", type="noul", instructions_json='{"ask": "refund?"}', labels={"true": "A", "false": "B"})
    body = {"state": "I was charged twice, refund please.", "model": "english", "max_len": 64, "min_confidence": 0.5,
            "questions": {"c": {"type": "choice", "instructions": "Which?", "criteria": [1, 2.5, "x"],
                                "option_order": [2, 0, 1]},
                          "n": {"type": "noul", "instructions": {"ask": "refund?"},
                                "labels": {"true": "A", "false": "B"}}}}
    a = stub.Decide(typed, metadata=md, timeout=30)
    b = stub.Decide(decision_pb2.DecideRequest(request_json=json.dumps(body)), metadata=md, timeout=30)
    assert a.json == b.json
    assert [x.id for x in a.answers] == ["c", "n"] and a.answers[0].choice_json in ("1", "2.5", '"x"')
    assert a.answers[0].abstention in ("passed", "abstained")


def test_decide_stream_answers_and_fails_exactly_as_decide(stack):
    """Every /v1/systemone probe, all at once on one DecideStream (AsyncLayaClient's path): each
    call's answer equals unary Decide's, each error has Decide's kind and detail, and the stream
    keeps serving after errors."""
    import asyncio
    from laya_grpc.core.errors import LayaError
    from laya_grpc.core.streams import StreamMux
    md = (("authorization", "Bearer " + stack.key),) if stack.key else None
    stub = decision_pb2_grpc.DecisionServiceStub(stack.channel)
    probes = [t for t in (_utf8(_encode(b)) for b in list(HAPPY.values()) + list(ERRORS.values())) if t]
    want = []
    for text in probes:
        try:
            want.append(("ok", json.loads(stub.Decide(decision_pb2.DecideRequest(request_json=text), metadata=md,
                                                      timeout=60).json)))
        except grpc.RpcError as e:
            want.append(("error", dict(e.trailing_metadata())[KIND_METADATA_KEY], e.details()))
    assert any(w[0] == "ok" for w in want) and any(w[0] == "error" for w in want)

    async def main():
        ch = grpc.aio.insecure_channel(stack.grpc)
        aio = decision_pb2_grpc.DecisionServiceStub(ch)
        mux = StreamMux(lambda: aio.DecideStream(metadata=md), decision_pb2.DecideCall, "gateway")

        async def one(text):
            try:
                return ("ok", json.loads((await mux.call(decision_pb2.DecideRequest(request_json=text), 60)).json))
            except LayaError as e:
                return ("error", e.kind.name, e.detail)
        try:
            return await asyncio.gather(*[one(t) for t in probes])
        finally:
            await mux.close()
            await ch.close()
    got = asyncio.run(main())
    for text, g, w in zip(probes, got, want):
        assert g == w, text[:200]


def test_decide_stream_auth(stack):
    if not stack.key:
        pytest.skip("auth off")
    import asyncio
    from laya_grpc.client import AsyncLayaClient
    from laya_grpc.core.errors import LayaError

    async def main(key):
        async with AsyncLayaClient(stack.grpc, api_key=key) as c:
            return await c.decide("x", {"u": {"type": "noul", "instructions": "urgent?"}}, model="english")
    for key in (None, "wrong"):
        with pytest.raises(LayaError) as e:
            asyncio.run(main(key))
        assert e.value.kind == Kind.UNAUTHENTICATED and e.value.detail == "invalid or missing bearer token"
    assert asyncio.run(main(KEY))["answers"]["u"]["type"] == "noul"
