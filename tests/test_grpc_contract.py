"""The gRPC twin of the HTTP contract, on the real stack, auth on and off.

Every probe of tests/test_http_contract.py (itself checked against upstream) goes to
`DecisionService` twice: as `request_json` (the body as is, when it is UTF-8) and as the typed
request the Python client builds from it (when the typed contract can carry it). Each must give
the HTTP route's answer: 200 -> the typed answer, read back as the HTTP dict, equals the HTTP body
(and `json`, when asked for with include_json, is that body); an error -> the gRPC code of the
HTTP status, the same message, the kind in the trailing metadata and in google.rpc.ErrorInfo,
BadRequest on INVALID_ARGUMENT.
"""
from __future__ import annotations

import json

import grpc
import httpx
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from laya_grpc.client.answers import batch_dict, response_dict
from laya_grpc.client.requests import build_batch, build_decide
from laya_grpc.core.errors import ERROR_DOMAIN, KIND_METADATA_KEY, Kind
from laya_proto.v1 import decision_pb2, decision_pb2_grpc
from stack import Stack
from test_http_contract import BATCH, ERRORS, HAPPY, KEY, _encode

KIND_BY_HTTP = {k.http_status: k for k in Kind if k.http_status != 500}


@pytest.fixture(scope="module", params=[None, KEY], ids=["auth-off", "auth-on"])
def stack(request, tiny_ckpt, tiny_ml_ckpt):
    # every probe at once on one DecideStream: each call takes an admission slot (16 by default)
    env = {"LAYA_MAX_CONCURRENT": "256"}
    if request.param:
        env["LAYA_API_KEY"] = request.param
    with Stack({"english": tiny_ckpt, "multilingual": tiny_ml_ckpt, "typed-decisions": tiny_ckpt}, env=env) as s:
        s.key = request.param
        s.channel = grpc.insecure_channel(s.grpc)
        s.md = (("authorization", "Bearer " + s.key),) if s.key else None
        s.stub = decision_pb2_grpc.DecisionServiceStub(s.channel)
        yield s
        s.channel.close()


def _utf8(raw: bytes):
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def details_of(e: grpc.RpcError) -> dict:
    """The google.rpc.Status details of a failed call, by type name."""
    st = rpc_status.from_call(e)
    assert st is not None and st.code == e.code().value[0] and st.message == e.details()
    out = {}
    for any_ in st.details:
        for cls in (error_details_pb2.ErrorInfo, error_details_pb2.BadRequest, error_details_pb2.RetryInfo):
            if any_.Is(cls.DESCRIPTOR):
                msg = cls()
                any_.Unpack(msg)
                out[cls.__name__] = msg
    return out


def check_error(e: grpc.RpcError, kind: Kind, detail: str) -> None:
    assert e.code() == kind.grpc_code
    assert e.details() == detail
    assert dict(e.trailing_metadata())[KIND_METADATA_KEY] == kind.name
    d = details_of(e)
    assert d["ErrorInfo"].reason == kind.name and d["ErrorInfo"].domain == ERROR_DOMAIN
    assert d["ErrorInfo"].metadata["http_status"] == str(kind.http_status)
    assert ("BadRequest" in d) == (kind.grpc_code == grpc.StatusCode.INVALID_ARGUMENT)
    assert ("RetryInfo" in d) == (kind is Kind.BUSY)


def _typed(route: str, raw: bytes):
    """The client's typed request for a probe body, or None when the body is not a dict it can type."""
    text = _utf8(raw)
    try:
        body = json.loads(text) if text else None
    except (ValueError, RecursionError):
        return None
    if not isinstance(body, dict):
        return None
    body = dict(body)
    if route.endswith("batch"):
        if "states" not in body or "questions" not in body:
            return None
        req = build_batch(body.pop("states"), body.pop("questions"), include_json=True, **body)
    else:
        if "state" not in body or "questions" not in body:
            return None
        req = build_decide(body.pop("state"), body.pop("questions"), include_json=True, **body)
    return None if req.request_json else req


def _check(stack, route: str, raw: bytes, name: str) -> None:
    http = httpx.post(stack.http + route, content=raw, headers=dict(stack.md or ()), timeout=60)
    batch = route.endswith("batch")
    call, to_dict = (stack.stub.DecideBatch, batch_dict) if batch else (stack.stub.Decide, response_dict)
    sent = []
    text = _utf8(raw)
    if text:    # not UTF-8: cannot travel in a protobuf string; empty: an unset field in proto3
        cls = decision_pb2.DecideBatchRequest if batch else decision_pb2.DecideRequest
        sent.append(("request_json", cls(request_json=text, include_json=True)))
    typed = _typed(route, raw)
    if typed is not None:
        sent.append(("typed", typed))
    if not sent:
        pytest.skip("neither UTF-8 nor a typed body")
    for how, req in sent:
        try:
            resp = call(req, metadata=stack.md, timeout=60)
        except grpc.RpcError as e:
            assert http.status_code != 200, "%s: gRPC failed (%s: %s) where HTTP answered 200" % (
                how, e.code(), e.details())
            check_error(e, KIND_BY_HTTP[http.status_code], http.json()["detail"])
            continue
        assert http.status_code == 200, "%s: gRPC answered where HTTP gave %d %s" % (how, http.status_code, http.text)
        assert to_dict(resp) == http.json(), how
        assert json.loads(resp.json) == http.json(), how
        if how == "typed" and not batch:   # key order too (maps aside: protobuf maps keep none)
            want = http.json()
            assert list(to_dict(resp)) == list(want)
            assert [list(a) for a in to_dict(resp)["answers"].values()] == [list(a) for a in want["answers"].values()]


@pytest.mark.parametrize("name", sorted(HAPPY))
def test_answers(stack, name):
    _check(stack, "/v1/systemone", _encode(HAPPY[name]), name)


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_errors(stack, name):
    _check(stack, "/v1/systemone", _encode(ERRORS[name]), name)


@pytest.mark.parametrize("name", sorted(BATCH))
def test_batch(stack, name):
    _check(stack, "/v1/systemone/batch", _encode(BATCH[name]), name)


def test_most_probes_travel_typed():
    """The typed path is what the probes above mostly exercise, errors included."""
    def typed(route, probes):
        return {n for n, b in probes.items() if _typed(route, _encode(b)) is not None}
    assert len(typed("/v1/systemone", HAPPY)) >= 40 and len(typed("/v1/systemone", ERRORS)) >= 30
    assert len(typed("/v1/systemone/batch", BATCH)) >= 5


def test_auth(stack):
    if not stack.key:
        pytest.skip("auth off")
    req = build_decide("x", {})
    for md in (None, (("authorization", "Bearer wrong"),), (("authorization", "bearer " + KEY),)):
        with pytest.raises(grpc.RpcError) as e:
            stack.stub.Decide(req, metadata=md, timeout=10)
        check_error(e.value, Kind.UNAUTHENTICATED, "invalid or missing bearer token")
    assert stack.stub.Decide(req, metadata=stack.md, timeout=10).model == "laya-rl-agent"


def _question(**kw) -> decision_pb2.Question:
    return decision_pb2.Question(**kw)


def _crit(label=None, description=None) -> decision_pb2.Criterion:
    c = decision_pb2.Criterion()
    if label is not None:
        key = {str: "string_value", bool: "bool_value", int: "int_value", float: "number_value"}[type(label)]
        setattr(c.label, key, label)
    if description is not None:
        c.description = description
    return c


def test_typed_answers_per_type_equal_http(stack):
    """Hand-written typed requests (no client builder): each question type answers with exactly
    the HTTP answer's values, x_jev_confidence included, and carries no field of another type."""
    Q = decision_pb2
    req = Q.DecideRequest(state=Q.StateValue(text="I was charged twice, refund please."), model="english",
                          max_len=64, min_confidence_all=0.5)
    req.questions.extend([
        _question(id="c", type=Q.QUESTION_TYPE_CHOICE, instructions_text="Which?",
                  criteria=[_crit(1), _crit(2.5), _crit("x"), _crit(False)], option_order=[3, 2, 0, 1]),
        _question(id="d", type=Q.QUESTION_TYPE_CHOICE, instructions_text="Dept?",
                  criteria=[_crit("billing", "money"), _crit("tech")]),
        _question(id="s", type=Q.QUESTION_TYPE_SCORE, instructions_text="Urgency?",
                  criteria=[_crit(description="low"), _crit(description="mid"), _crit(description="high")]),
        _question(id="n", type=Q.QUESTION_TYPE_NOUL, instructions_json='{"ask": "refund?"}',
                  criteria=[_crit(True, "asks for money back")], labels=Q.NoulLabels(false_label="B", true_label="A")),
    ])
    body = {"state": "I was charged twice, refund please.", "model": "english", "max_len": 64, "min_confidence": 0.5,
            "questions": {"c": {"type": "choice", "instructions": "Which?", "criteria": [1, 2.5, "x", False],
                                "option_order": [3, 2, 0, 1]},
                          "d": {"type": "choice", "instructions": "Dept?", "criteria": {"billing": "money", "tech": None}},
                          "s": {"type": "score", "instructions": "Urgency?", "criteria": ["low", "mid", "high"]},
                          "n": {"type": "noul", "instructions": {"ask": "refund?"},
                                "criteria": {"true": "asks for money back"}, "labels": {"true": "A", "false": "B"}}}}
    http = httpx.post(stack.http + "/v1/systemone", json=body, headers=dict(stack.md or ()), timeout=60).json()
    resp = stack.stub.Decide(req, metadata=stack.md, timeout=30)
    assert not resp.HasField("json")            # the body is rendered only on include_json
    assert response_dict(resp) == http
    by_id = {a.id: a for a in resp.answers}
    c, h = by_id["c"], http["answers"]["c"]
    assert c.WhichOneof("answer") == "choice" and c.type == Q.QUESTION_TYPE_CHOICE
    assert c.choice.choice.WhichOneof("value") == {str: "string_value", bool: "bool_value", int: "int_value",
                                                   float: "number_value"}[type(h["choice"])]
    assert c.choice.x_jev_confidence == h["x_jev_confidence"] and c.confidence == h["confidence"]
    assert [p.probability for p in c.choice.probabilities] == list(h["probabilities"].values())
    s, h = by_id["s"], http["answers"]["s"]
    assert s.WhichOneof("answer") == "score" and s.score.score == h["score"]
    assert list(s.score.probabilities) == list(h["probabilities"].values()) and list(s.score.legend) == ["low", "mid", "high"]
    assert s.score.x_jev_confidence == h["x_jev_confidence"]
    n, h = by_id["n"], http["answers"]["n"]
    assert n.WhichOneof("answer") == "noul" and n.noul.noul == h["noul"]
    assert "x_jev_confidence" not in h and not n.HasField("choice") and not n.HasField("score")
    for a in resp.answers:
        assert a.abstention != Q.ABSTENTION_UNSPECIFIED and a.HasField("abstention_threshold")
        assert [f.name for f, _ in a.ListFields() if f.name in ("choice", "score", "noul")] == [a.WhichOneof("answer")]


@pytest.mark.parametrize("req, field, text", [
    (decision_pb2.DecideRequest(state=decision_pb2.StateValue(text="x"), request_json='{"state": "y", "questions": {}}'),
     "request_json", "cannot be combined with state"),
    (decision_pb2.DecideRequest(model="english", request_json='{"state": "y", "questions": {}}'),
     "request_json", "cannot be combined with model"),
    (decision_pb2.DecideRequest(state=decision_pb2.StateValue(json="{nope"), questions=[]),
     "state.json", "state.json is not valid JSON"),
    (decision_pb2.DecideRequest(state=decision_pb2.StateValue(text="x"), questions=[decision_pb2.Question(
        id="q", type=decision_pb2.QUESTION_TYPE_CHOICE, instructions_text="?", criteria=[_crit("a"), _crit()])]),
     'questions["q"].criteria[1].label', "a label sets one of"),
    (decision_pb2.DecideRequest(state=decision_pb2.StateValue(text="x"), questions=[decision_pb2.Question(
        id="q", type=decision_pb2.QUESTION_TYPE_CHOICE, instructions_text="?", criteria=[_crit("a", "d"), _crit(1)])]),
     'questions["q"].criteria[1].label', "takes a string label"),
    (decision_pb2.DecideRequest(state=decision_pb2.StateValue(text="x"), questions=[decision_pb2.Question(
        id="q", type=decision_pb2.QUESTION_TYPE_SCORE, instructions_text="?", criteria=[_crit("a", "d")])]),
     'questions["q"].criteria[0].label', "a score level has no label"),
    (decision_pb2.DecideRequest(state=decision_pb2.StateValue(text="x"), questions=[decision_pb2.Question(
        id="q", type=decision_pb2.QUESTION_TYPE_NOUL, instructions_text="?", criteria=[_crit("yes", "d")])]),
     'questions["q"].criteria[0].label', "labelled bool_value true"),
    (decision_pb2.DecideRequest(state=decision_pb2.StateValue(text="x"), questions=[
        decision_pb2.Question(id="q", type=decision_pb2.QUESTION_TYPE_NOUL, instructions_text="?"),
        decision_pb2.Question(id="q", type=decision_pb2.QUESTION_TYPE_NOUL, instructions_text="?")]),
     "questions[1].id", "given twice"),
], ids=["text+request_json", "model+request_json", "bad-state-json", "label-unset", "int-label-with-description",
        "score-label", "noul-label", "duplicate-id"])
def test_typed_request_errors_name_the_field(stack, req, field, text):
    """What only the typed form can get wrong fails INVALID_ARGUMENT with the field's path, and
    the service keeps serving."""
    with pytest.raises(grpc.RpcError) as e:
        stack.stub.Decide(req, metadata=stack.md, timeout=10)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and text in e.value.details()
    [violation] = details_of(e.value)["BadRequest"].field_violations
    assert violation.field == field and violation.description == e.value.details()
    assert stack.stub.Decide(build_decide("x", {}), metadata=stack.md, timeout=10).model == "laya-rl-agent"


def test_decide_stream_answers_and_fails_exactly_as_decide(stack):
    """Every /v1/systemone probe, all at once on one DecideStream (AsyncLayaClient's path), typed
    where the client can type it: each call's answer equals unary Decide's, each error has
    Decide's kind and detail, and the stream keeps serving after errors."""
    import asyncio
    from laya_grpc.core.errors import LayaError
    from laya_grpc.core.wire.calls import stream_mux
    reqs = []
    for body in list(HAPPY.values()) + list(ERRORS.values()):
        raw = _encode(body)
        req = _typed("/v1/systemone", raw)
        if req is None and _utf8(raw):
            req = decision_pb2.DecideRequest(request_json=_utf8(raw))
        if req is not None:
            reqs.append(req)
    want = []
    for req in reqs:
        try:
            want.append(("ok", response_dict(stack.stub.Decide(req, metadata=stack.md, timeout=60))))
        except grpc.RpcError as e:
            want.append(("error", dict(e.trailing_metadata())[KIND_METADATA_KEY], e.details()))
    assert any(w[0] == "ok" for w in want) and any(w[0] == "error" for w in want)

    async def main():
        ch = grpc.aio.insecure_channel(stack.grpc)
        aio = decision_pb2_grpc.DecisionServiceStub(ch)
        mux = stream_mux(lambda: aio.DecideStream(metadata=stack.md), decision_pb2.DecideCall, "gateway")

        async def one(req):
            try:
                return ("ok", response_dict(await mux.call(req, 60)))
            except LayaError as e:
                return ("error", e.kind.name, e.detail)
        try:
            return await asyncio.gather(*[one(r) for r in reqs])
        finally:
            await mux.close()
            await ch.close()
    got = asyncio.run(main())
    for req, g, w in zip(reqs, got, want):
        assert g == w, str(req)[:200]


def test_python_client_returns_the_http_dict(stack):
    """LayaClient / AsyncLayaClient: HTTP-shaped dicts by default, messages with typed=True."""
    import asyncio
    from laya_grpc.client import AsyncLayaClient, LayaClient
    body = HAPPY["mixed"]
    headers = dict(stack.md or ())
    http = httpx.post(stack.http + "/v1/systemone", json=body, headers=headers, timeout=60).json()
    batch = BATCH["controls"]
    http_batch = httpx.post(stack.http + "/v1/systemone/batch", json=batch, headers=headers, timeout=60).json()
    controls = {k: v for k, v in batch.items() if k not in ("states", "questions")}
    with LayaClient(stack.grpc, api_key=stack.key) as c:
        assert c.decide(body["state"], body["questions"]) == http
        assert c.decide_batch(batch["states"], batch["questions"], **controls) == http_batch
    with LayaClient(stack.grpc, api_key=stack.key, typed=True) as c:
        assert response_dict(c.decide(body["state"], body["questions"])) == http

    async def main():
        async with AsyncLayaClient(stack.grpc, api_key=stack.key) as c:
            return await c.decide(body["state"], body["questions"])
    assert asyncio.run(main()) == http


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


def test_unreachable_backend_names_no_address(tmp_path):
    """A call to a service that is not there fails BUSY (retryable) without the socket path or
    address gRPC's own message names, unary and streamed alike."""
    import asyncio
    from laya_grpc.core.wire import rpc
    from laya_grpc.core.wire.calls import stream_mux
    from laya_grpc.core.errors import LayaError
    sock = str(tmp_path / "gone.sock")
    with grpc.insecure_channel("unix:" + sock) as ch:
        with pytest.raises(grpc.RpcError) as e:
            decision_pb2_grpc.DecisionServiceStub(ch).Decide(decision_pb2.DecideRequest(), timeout=5)
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE and sock in e.value.details()   # what gRPC says
    err = rpc.error_from_rpc(e.value, "tokenizer")
    assert err.kind is Kind.BUSY and sock not in err.detail and "unix" not in err.detail, err.detail
    assert rpc.status_of(err).details[-1].Is(error_details_pb2.RetryInfo.DESCRIPTOR)

    async def streamed():
        ch = rpc.channel(sock)
        mux = stream_mux(lambda: decision_pb2_grpc.DecisionServiceStub(ch).DecideStream(), decision_pb2.DecideCall,
                         "gateway")
        try:
            await mux.call(decision_pb2.DecideRequest(), 5)
        finally:
            await mux.close()
            await ch.close()
    with pytest.raises(LayaError) as e2:
        asyncio.run(streamed())
    assert e2.value.kind is Kind.BUSY and sock not in e2.value.detail and "unix" not in e2.value.detail, e2.value.detail
