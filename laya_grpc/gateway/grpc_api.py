"""The gateway's gRPC front: DecisionService (Decide, DecideBatch, DecideStream) and
StatusService (GetStatus, Watch).

Servicers stay tiny: a typed request becomes the decoded body the HTTP route would get
(`typed_request`, no JSON text in between), goes through the same checks and decider (so every
rule and error text is shared), and the result dict is packed into typed messages
(`typed_answer`). The exact HTTP body is rendered only for a request that asks (`include_json`).
"""
from __future__ import annotations

import hmac
import time
from typing import Optional

from laya_grpc.core import calls, request_id, request_scope, rpc
from laya_grpc.core.errors import Kind, LayaError
from laya_grpc.core.lifecycle import ChangeFeed, clamp_heartbeat
from laya_proto.v1 import decision_pb2, decision_pb2_grpc, status_pb2, tokens_pb2
from laya_grpc.engine import deadline
from laya_grpc.engine.decider import Decider

from .contract import parse_batch, parse_decide
from .http_app import UNAUTHORIZED_DETAIL
from .render import render_json
from .typed_answer import pack_result
from .typed_request import batch_body, decide_body

S = status_pb2


class DecisionServicer(decision_pb2_grpc.DecisionServiceServicer):
    def __init__(self, decider: Decider, api_key: Optional[str], max_token_budget: int,
                 admission: Optional[Admission] = None):
        self.decider, self.max_token_budget = decider, max_token_budget
        self.admission = admission   # DecideStream's calls take slots one by one (grpc_guards covers the unary RPCs)
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
        with request_scope.observed("grpc", "decide", *request_id.from_metadata(context.invocation_metadata())) as scope, \
                deadline.within(context.time_remaining()):   # the client's deadline bounds the backend calls
            await context.send_initial_metadata(((request_id.HEADER, scope.request_id),))
            return await self._decide(request, self._denied(context))

    async def DecideStream(self, request_iterator, context):
        # checked once per stream; without the token every call fails 401 as a reply (aborting the
        # stream instead races the client's first write, which then sees a transport error)
        denied = self._denied(context)
        _, traceparent = request_id.from_metadata(context.invocation_metadata())

        async def one(request):   # each call is a request of its own: own id, span, access-log line
            with request_scope.observed("grpc", "decide", None, traceparent):
                if denied is not None or self.admission is None:
                    return await self._decide(request, denied)
                async with self.admission.slot():   # over the limit: this call's reply is the 503 (UNAVAILABLE)
                    self.admission.trim.add(request.ByteSize())
                    return await self._decide(request, denied)
        await calls.serve_calls(request_iterator, context, one,
                                decision_pb2.DecideReply, tokens_pb2.CallError, "Decide")

    async def _decide(self, request, denied: Optional[LayaError]):
        if denied is not None:
            raise denied
        body = decide_body(request)
        req = parse_decide(body.value, self.decider.route_table, self.max_token_budget, body.may_hold_surrogate)
        t0 = time.perf_counter()
        result = await self.decider.decide(req)
        resp = decision_pb2.DecideResponse(inference_ms=(time.perf_counter() - t0) * 1e3)
        if request.include_json:
            resp.json = render_json(result).decode("utf-8")   # first: a NaN is its 422 here too
        pack_result(result, resp)
        return resp

    @rpc.servicer_errors
    async def DecideBatch(self, request, context):
        with request_scope.observed("grpc", "batch", *request_id.from_metadata(context.invocation_metadata())) as scope, \
                deadline.within(context.time_remaining()):
            await context.send_initial_metadata(((request_id.HEADER, scope.request_id),))
            return await self._decide_batch(request, context)

    async def _decide_batch(self, request, context):
        self._auth(context)
        body = batch_body(request)
        req = parse_batch(body.value, self.decider.route_table, self.max_token_budget, body.may_hold_surrogate)
        t0 = time.perf_counter()
        result = await self.decider.decide_batch(req)
        resp = decision_pb2.DecideBatchResponse(inference_ms=(time.perf_counter() - t0) * 1e3)
        if request.include_json:
            resp.json = render_json(result).decode("utf-8")
        for r in result["results"]:
            pack_result(r, resp.results.add())
        resp.total_usage.input_tokens = result["total_usage"]["input_tokens"]
        resp.total_usage.output_tokens = result["total_usage"]["output_tokens"]
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
