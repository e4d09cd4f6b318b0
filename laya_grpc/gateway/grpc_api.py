"""The gateway's gRPC front: DecisionService (Decide, DecideBatch) and StatusService (Watch).

Servicers stay tiny: a request message becomes the same JSON body the HTTP route would get,
goes through the same parser and decider (so every rule and error text is shared), and the
result dict is packed into typed messages plus its exact JSON.
"""
from __future__ import annotations

import hmac
import json
import time
from typing import Any, Optional

from laya_grpc.core import metrics, rpc, streams
from laya_grpc.core.errors import Kind, LayaError
from laya_grpc.core.lifecycle import ChangeFeed, clamp_heartbeat
from laya_proto.v1 import decision_pb2, decision_pb2_grpc, status_pb2, tokens_pb2

from .admission import MAX_BODY_BYTES, TOO_LARGE_DETAIL
from .contract import parse_batch_body, parse_decide_body
from .decider import Decider
from .http_app import UNAUTHORIZED_DETAIL
from .render import render_json

S = status_pb2


def _json(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as e:
        raise LayaError(Kind.BAD_REQUEST, "%s is not valid JSON: %s" % (what, e)) from None


def _questions(qs) -> dict:
    out: dict = {}
    for q in qs:
        if q.id in out:
            raise LayaError(Kind.INVALID, "question id %r is given twice" % q.id)
        d: dict = {"type": q.type,
                   "instructions": _json(q.instructions_json, "questions[%r].instructions_json" % q.id)
                   if q.instructions_json else q.instructions}
        if q.criteria_json:
            d["criteria"] = _json(q.criteria_json, "questions[%r].criteria_json" % q.id)
        if q.labels:
            d["labels"] = dict(q.labels)
        if len(q.option_order):
            d["option_order"] = list(q.option_order)
        out[q.id] = d
    return out


def _controls(req, body: dict) -> None:
    for name in ("model", "task", "lang", "lang_guess"):
        value = getattr(req, name)
        if value:
            body[name] = value
    for name in ("max_len", "head_max_len"):
        if req.HasField(name):
            body[name] = getattr(req, name)
    if req.min_confidence_json:
        body["min_confidence"] = _json(req.min_confidence_json, "min_confidence_json")


def _only_request_json(req, fields) -> bool:
    if not req.request_json:
        return False
    if any(req.HasField(f) if f in ("max_len", "head_max_len") else bool(getattr(req, f)) for f in fields):
        raise LayaError(Kind.BAD_REQUEST, "request_json replaces the other fields; send one or the other")
    return True


def _capped(body: bytes) -> bytes:
    """The HTTP route's 2 MiB body cap applies to the same body sent over gRPC."""
    if len(body) > MAX_BODY_BYTES:
        raise LayaError(Kind.TOO_LARGE, TOO_LARGE_DETAIL)
    return body


def decide_body(req: decision_pb2.DecideRequest) -> bytes:
    if req.WhichOneof("state") is None and _only_request_json(
            req, ("questions", "model", "task", "lang", "lang_guess", "max_len", "head_max_len", "min_confidence_json")):
        return req.request_json.encode("utf-8")
    body: dict = {}
    which = req.WhichOneof("state")
    if which == "text":
        body["state"] = req.text
    elif which == "state_json":
        body["state"] = _json(req.state_json, "state_json")
    body["questions"] = _questions(req.questions)
    _controls(req, body)
    return json.dumps(body, ensure_ascii=False).encode("utf-8")


def batch_body(req: decision_pb2.DecideBatchRequest) -> bytes:
    if _only_request_json(req, ("states_json", "questions", "model", "task", "lang", "lang_guess", "max_len",
                                "head_max_len", "min_confidence_json")):
        return req.request_json.encode("utf-8")
    body = {"states": [_json(s, "states_json[%d]" % i) for i, s in enumerate(req.states_json)],
            "questions": _questions(req.questions)}
    _controls(req, body)
    return json.dumps(body, ensure_ascii=False).encode("utf-8")


def _json_key(key: Any) -> str:
    """A dict key as `json.dumps` writes it (labels 1, 2.5, True become "1", "2.5", "true")."""
    if isinstance(key, str):
        return key
    if isinstance(key, float):
        return float.__repr__(key)
    if key is True:
        return "true"
    if key is False:
        return "false"
    if key is None:
        return "null"
    if isinstance(key, int):
        return int.__repr__(key)
    return str(key)


def _json_keyed(d: dict) -> dict:
    """`json.loads(json.dumps(d))` for a flat dict of JSON scalars: keys that collide as strings
    (labels 1 and "1") keep the first one's place and the last one's value, as json.loads does."""
    if all(type(k) is str for k in d):
        return d
    out: dict = {}
    for k, v in d.items():
        out[_json_key(k)] = v
    return out


def pack_result(result: dict, msg: decision_pb2.DecideResponse) -> str:
    """Typed fields, read as the JSON form shows them (label keys become strings exactly as HTTP
    shows them), plus that JSON itself, which is returned too."""
    body = render_json(result).decode("utf-8")   # first: a NaN anywhere is the 422 here too
    for qid, a in result.get("answers", {}).items():
        m = msg.answers.add(id=qid, type=a["type"])
        if "choice" in a:
            m.choice_json = json.dumps(a["choice"], ensure_ascii=False)
        if "score" in a:
            m.score = a["score"]
        if "noul" in a:
            m.noul = a["noul"]
        for label, p in _json_keyed(a.get("probabilities") or {}).items():
            m.probabilities.add(label=label, p=p)
        for k, v in _json_keyed(a.get("legend") or {}).items():
            m.legend[k] = v
        m.confidence = a.get("confidence", 0.0)
        m.answer_confidence = a.get("answer_confidence", 0.0)
        m.act_probability = (a.get("action") or {}).get("act_probability", 0.0)
        if "abstention" in a:
            m.abstention = a["abstention"]
            m.abstention_threshold = a["abstention_threshold"]
        m.low_confidence = bool(a.get("low_confidence", False))
    u = result.get("usage", {})
    msg.usage.input_tokens = u.get("input_tokens", 0)
    msg.usage.output_tokens = u.get("output_tokens", 0)
    msg.usage.state_tokens = u.get("state_tokens", 0)
    msg.usage.state_tokens_dropped = u.get("state_tokens_dropped", 0)
    msg.usage.truncated = bool(u.get("truncated", False))
    msg.usage.truncated_questions.extend(u.get("truncated_questions", []))
    r = result.get("routing")
    if r:
        msg.routing.model, msg.routing.repo, msg.routing.reason = r["model"], str(r["repo"]), r["reason"]
        msg.routing.detection_json = json.dumps(r.get("detection"), ensure_ascii=False)
        msg.routing.workflow = r.get("workflow") or ""
    msg.json = body
    return body


class DecisionServicer(decision_pb2_grpc.DecisionServiceServicer):
    def __init__(self, decider: Decider, api_key: Optional[str], max_token_budget: int):
        self.decider, self.max_token_budget = decider, max_token_budget
        # as the HTTP side: bytes with surrogateescape, so any key or header compares, never raises
        self._expected = ("Bearer " + api_key).encode("utf-8", "surrogateescape") if api_key else None

    def _denied(self, context) -> Optional[LayaError]:
        """The 401 for a call (or a stream) without the right bearer token; None when it may pass."""
        if self._expected is None:
            return None
        supplied = dict(context.invocation_metadata()).get("authorization", "")
        if not hmac.compare_digest(str(supplied).encode("utf-8", "surrogateescape"), self._expected):
            return LayaError(Kind.UNAUTHENTICATED, UNAUTHORIZED_DETAIL)
        return None

    def _auth(self, context) -> None:
        denied = self._denied(context)
        if denied is not None:
            raise denied

    @rpc.servicer_errors
    async def Decide(self, request, context):
        return await self._decide(request, self._denied(context))

    async def DecideStream(self, request_iterator, context):
        # checked once per stream; without the token every call fails 401 as a reply (aborting the
        # stream instead races the client's first write, which then sees a transport error)
        denied = self._denied(context)
        await streams.serve_calls(request_iterator, context, lambda request: self._decide(request, denied),
                                  decision_pb2.DecideReply, tokens_pb2.CallError, "Decide")

    async def _decide(self, request, denied: Optional[LayaError]):
        with metrics.measured("grpc", "decide"):
            if denied is not None:
                raise denied
            req = parse_decide_body(_capped(decide_body(request)), self.decider.route_table, self.max_token_budget)
            t0 = time.perf_counter()
            result = await self.decider.decide(req)
            resp = decision_pb2.DecideResponse(inference_ms=(time.perf_counter() - t0) * 1e3)
            pack_result(result, resp)
            return resp

    @rpc.servicer_errors
    async def DecideBatch(self, request, context):
        with metrics.measured("grpc", "batch"):
            return await self._decide_batch(request, context)

    async def _decide_batch(self, request, context):
        self._auth(context)
        req = parse_batch_body(_capped(batch_body(request)), self.decider.route_table, self.max_token_budget)
        t0 = time.perf_counter()
        result = await self.decider.decide_batch(req)
        resp = decision_pb2.DecideBatchResponse(inference_ms=(time.perf_counter() - t0) * 1e3)
        bodies = [pack_result(r, resp.results.add()) for r in result["results"]]
        # == render_json(result): the compact form of {"results": [...], "total_usage": {...}}
        resp.json = '{"results":[%s],"total_usage":%s}' % (",".join(bodies),
                                                             render_json(result["total_usage"]).decode("utf-8"))
        return resp


class StatusServicer(decision_pb2_grpc.StatusServiceServicer):
    """Pushes the state of every service and checkpoint on change, with heartbeats in between."""

    def __init__(self, services, feed: ChangeFeed, address: str, heartbeat_s: float = 2.0):
        self.services, self.feed, self.address, self.heartbeat_s = services, feed, address, heartbeat_s

    def event(self, reason: str) -> decision_pb2.StatusEvent:
        ev = decision_pb2.StatusEvent(sequence=self.feed.sequence, time_unix=time.time(),
                                      ready=self.services.ready(), reason=reason)
        ev.services.add(service="gateway", state=S.STATE_READY if ev.ready else S.STATE_STARTING,
                        detail=getattr(self.services, "warm_detail", ""),
                        instance_id=self.feed.instance_id, sequence=self.feed.sequence, time_unix=ev.time_unix,
                        started_unix=self.feed.started, address=self.address)
        for b in self.services.backends:
            if b.service == "inference" and b.status is not None:
                st = ev.services.add()   # its own detailed view: checkpoints loading, warming, ready
                st.CopyFrom(b.status)
                st.restarts = b.downs
            else:
                ev.services.add(service=b.service, state=b.state, detail=b.detail, address=b.address,
                                restarts=b.downs)
        return ev

    @rpc.servicer_errors
    async def GetStatus(self, request, context):
        return self.event("initial")

    async def Watch(self, request, context):
        heartbeat = clamp_heartbeat(request.heartbeat_s, self.heartbeat_s)
        seen = self.feed.sequence
        await context.write(self.event("initial"))
        while True:
            changed = await self.feed.wait(seen, heartbeat)
            seen = self.feed.sequence
            await context.write(self.event("change" if changed else "heartbeat"))
