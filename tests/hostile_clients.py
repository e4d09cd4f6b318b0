"""Clients that behave badly on purpose, shared by tests/test_hostile_*.py and benchmarks/hostile.py:
raw gRPC calls with arbitrary bytes, hypothesis strategies for both transports' requests, slow
sockets, and the large request that upstream's limits admit."""
from __future__ import annotations

import json
import socket
import time

import grpc
from hypothesis import strategies as st

from laya_proto.v1 import decision_pb2

DECISION = "/" + decision_pb2.DESCRIPTOR.services_by_name["DecisionService"].full_name
STATUS = "/" + decision_pb2.DESCRIPTOR.services_by_name["StatusService"].full_name
REFLECTION = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
HEALTH = "/grpc.health.v1.Health"
# (method, request streaming, response streaming) of every public RPC
PUBLIC_METHODS = [(DECISION + "/Decide", False, False), (DECISION + "/DecideBatch", False, False),
                  (DECISION + "/DecideStream", True, True), (STATUS + "/GetStatus", False, False),
                  (STATUS + "/Watch", False, True), (HEALTH + "/Check", False, False),
                  (HEALTH + "/Watch", False, True), (REFLECTION, True, True)]
BAD_CODES = (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN)

SMALL = {"model": "english", "state": "My parcel is late again and nobody answers.",
         "questions": {"late": {"type": "noul", "instructions": "Is the parcel late?"},
                       "mood": {"type": "choice", "instructions": "Mood?", "criteria": ["calm", "angry"]}}}


def large_batch(n_states: int = 64, n_questions: int = 64) -> dict:
    """The largest batch upstream's limits admit in shape (64 states x 64 questions = 4,096 rows,
    ~28 KB), each state ~330 characters."""
    states = [("State %d: the customer wrote about a late delivery and a refund request, twice. " % i) * 4
              for i in range(n_states)]
    qs = {"q%d" % j: {"type": "choice", "instructions": "Which option fits number %d?" % j,
                      "criteria": ["yes", "no", "maybe"]} for j in range(n_questions)}
    return {"model": "english", "states": states, "questions": qs}


def raw_call(channel: grpc.Channel, method: str, req_stream: bool, resp_stream: bool, payload: bytes,
             metadata=None, timeout: float = 10.0):
    """Send `payload` bytes as the request message of `method`; the status code it ends with
    (OK when it answered)."""
    try:
        if not req_stream and not resp_stream:
            channel.unary_unary(method)(payload, metadata=metadata, timeout=timeout)
        elif not req_stream:
            for _ in channel.unary_stream(method)(payload, metadata=metadata, timeout=timeout):
                break
        else:
            call = channel.stream_stream(method)(iter([payload]), metadata=metadata, timeout=timeout)
            for _ in call:
                break
            call.cancel()
            return grpc.StatusCode.OK
        return grpc.StatusCode.OK
    except grpc.RpcError as e:
        return e.code()


# -- hypothesis strategies --------------------------------------------------------------------
_scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                     st.text(max_size=40))
json_values = st.recursive(_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)), max_leaves=12)
_keys = st.sampled_from(["state", "states", "questions", "model", "task", "lang", "lang_guess", "max_len",
                         "head_max_len", "min_confidence", "batch_size", "sort_by_length", "type",
                         "instructions", "criteria", "labels", "option_order"])
_question = st.fixed_dictionaries({"type": st.one_of(st.sampled_from(["choice", "score", "noul", "x"]), json_values),
                                   "instructions": st.one_of(st.text(max_size=30), json_values)},
                                  optional={"criteria": json_values, "labels": json_values,
                                            "option_order": json_values})
_body = st.fixed_dictionaries(
    {}, optional={"state": json_values, "states": st.lists(json_values, max_size=3),
                  "questions": st.one_of(st.dictionaries(st.text(max_size=8), _question, max_size=3), json_values),
                  "model": st.one_of(st.sampled_from(["english", "multilingual", "nope"]), json_values),
                  "max_len": json_values, "head_max_len": json_values, "min_confidence": json_values,
                  "lang": json_values, "task": json_values, "batch_size": json_values})


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def _hostile_text():
    """JSON text a hostile client would try: deep nesting, lone surrogate escapes, numbers
    too large, NaN, truncations and plain garbage."""
    return st.one_of(
        json_values.map(lambda v: json.dumps(v)),
        _body.map(lambda v: json.dumps(v)),
        st.integers(100, 5000).map(_nested),
        st.integers(100, 3000).map(lambda d: '{"state": %s, "questions": {}}' % _nested(d)),
        st.sampled_from(['"\\ud800"', '{"a": "\\udc00x"}', '{"\\ud800": 1}', "1e999999", "NaN", "-Infinity",
                         "[" * 100000, '{"state": "x", "questions": {"q": {"type": "noul", "instructions": "\\ud800"}}}']),
        st.text(max_size=60),
        _body.map(lambda v: json.dumps(v)[: max(1, len(json.dumps(v)) // 2)]))


http_bodies = st.one_of(_hostile_text().map(lambda t: t.encode("utf-8", "surrogatepass")),
                        st.binary(max_size=200))


@st.composite
def grpc_decide_requests(draw):
    """A DecideRequest with any field set to hostile text (or a decodable-looking request_json)."""
    req = decision_pb2.DecideRequest()
    if draw(st.booleans()):
        req.request_json = draw(_hostile_text())
        return req
    which = draw(st.sampled_from(["text", "json", None]))
    if which == "text":
        req.state.text = draw(st.text(max_size=50))
    elif which == "json":
        req.state.json = draw(_hostile_text())
    for i in range(draw(st.integers(0, 3))):
        q = req.questions.add(id=draw(st.text(max_size=6)), type=draw(st.integers(0, 4)))
        if draw(st.booleans()):
            q.instructions_json = draw(_hostile_text())
        else:
            q.instructions_text = draw(st.text(max_size=30))
        for _ in range(draw(st.integers(0, 2))):
            q.criteria.add()
    if draw(st.booleans()):
        req.model = draw(st.sampled_from(["english", "nope", ""]))
    if draw(st.booleans()):
        req.max_len = draw(st.integers(0, 10**6))
    if draw(st.booleans()):
        req.min_confidence_all = draw(st.floats(allow_nan=True, allow_infinity=True))
    return req


@st.composite
def grpc_batch_requests(draw):
    req = decision_pb2.DecideBatchRequest()
    if draw(st.booleans()):
        req.request_json = draw(_hostile_text())
        return req
    for text in draw(st.lists(_hostile_text(), max_size=3)):
        req.states.add(json=text)
    for i in range(draw(st.integers(0, 2))):
        q = req.questions.add(id="q%d" % i, type=draw(st.integers(0, 3)))
        q.instructions_json = draw(_hostile_text())
    return req


# -- slow sockets -------------------------------------------------------------------------------
def open_until_closed(host: str, port: int, send: bytes = b"", drip_s: float = 0.0, limit_s: float = 60.0) -> float:
    """Connect, send `send` (one byte every `drip_s` if > 0), never finish the request; seconds
    until the server closed the connection (limit_s if it never did)."""
    t0 = time.monotonic()
    with socket.create_connection((host, port), timeout=limit_s) as s:
        s.settimeout(0.2)
        i = 0
        while time.monotonic() - t0 < limit_s:
            if i < len(send) and (drip_s == 0 or time.monotonic() - t0 >= i * drip_s):
                chunk = send[i:] if drip_s == 0 else send[i:i + 1]
                try:
                    s.sendall(chunk)
                except OSError:
                    return time.monotonic() - t0
                i += len(chunk)
            try:
                if s.recv(65536) == b"":
                    return time.monotonic() - t0
            except socket.timeout:
                continue
            except OSError:
                return time.monotonic() - t0
    return limit_s
