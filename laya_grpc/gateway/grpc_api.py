"""The gateway's gRPC front: DecisionService (Decide, DecideBatch, DecideStream) and
StatusService (GetStatus, Watch).

Servicers stay tiny: a typed request becomes the decoded body the HTTP route would get
(`typed_request`, no JSON text in between), goes through the same checks and decider (so every
rule and error text is shared), and the engine's typed answer is packed into the messages
(`typed_answer`). The exact HTTP body is rendered only for a request that asks (`include_json`).
Auth, admission and readiness are the gateway's `Policy` (policy.py), the one the HTTP front
calls: each decision (a Decide, a DecideBatch, each call on a DecideStream) takes an admission
slot, waiting in the bounded queue, then its rows; past the queue it is UNAVAILABLE with
RetryInfo and `retry-after` metadata.
"""
from __future__ import annotations

import time

from laya_grpc.core.runtime import logs, request_id
from laya_grpc.core.wire import calls, rpc
from . import request_scope
from laya_grpc.core.runtime.lifecycle import ChangeFeed, clamp_heartbeat
from laya_proto.v1 import decision_pb2, decision_pb2_grpc, status_pb2, tokens_pb2

from laya_grpc.engine import deadline
from laya_grpc.engine.decider import Decider
from laya_grpc.engine.requests import Controls

from .admission import Ticket, rows_of
from .http_body import parse_batch, parse_decide
from .policy import Policy, bearer_of
from .readiness import Readiness
from .render import render_json
from .typed_answer import pack_batch, pack_decision
from .typed_request import batch_body, decide_body

S = status_pb2
# Trace span names of the decision RPCs, in OpenTelemetry's `package.Service/Method` form.
_OPERATION = {m.name: "%s/%s" % (m.containing_service.full_name, m.name)
              for m in decision_pb2.DESCRIPTOR.services_by_name["DecisionService"].methods}


UNKNOWN_MODEL_KEY = "laya-unknown-model"
# calls running on one DecideStream at most; the stream reads the next when one ends (flow control
# holds the client meanwhile). A client wanting more in flight opens more streams, each of which the
# admission queue counts call by call.
STREAM_MAX_CALLS = 128


def peer_host(context) -> tuple[str, str]:
    """The admission client of a gRPC call, transport and peer host (not the port: one client
    opens many connections), and its connection, which a retry delay binds (peer host and port)."""
    peer = context.peer() or ""
    return "grpc:" + (peer.rsplit(":", 1)[0] if peer.startswith(("ipv4:", "ipv6:")) else peer), "grpc:" + peer


def _expired(context):
    """Whether the call's deadline has passed (a cancelled call is DEADLINE_EXCEEDED, not CANCELLED)."""
    def expired() -> bool:
        left = context.time_remaining()
        return left is not None and left <= 0.05   # a backend call cut at the deadline ends a hair before it
    return expired


def _say_unknown_model(controls: Controls, context) -> None:
    """A `model` that names no checkpoint here was auto-routed, as upstream does; the answer (the
    HTTP answer's values, field for field) stays upstream's and the trailing metadata names it."""
    if controls.unknown_model is not None and context is not None:
        context.set_trailing_metadata(((UNKNOWN_MODEL_KEY, logs.header_value(controls.unknown_model)),))


class DecisionServicer(decision_pb2_grpc.DecisionServiceServicer):
    def __init__(self, decider: Decider, policy: Policy, max_token_budget: int):
        self.decider, self.policy, self.max_token_budget = decider, policy, max_token_budget

    @rpc.servicer_errors
    async def Decide(self, request, context):
        with request_scope.observed("grpc", "decide", *request_id.from_metadata(context.invocation_metadata()),
                                    operation=_OPERATION["Decide"]) as scope, \
                deadline.within(context.time_remaining()):   # the client's deadline bounds the queue and backend calls
            scope.expired = _expired(context)
            await context.send_initial_metadata(((request_id.HEADER, scope.request_id),))
            async with self.policy.admission.enter(*peer_host(context)) as ticket:
                return await self._decide(request, ticket, context)

    async def DecideStream(self, request_iterator, context):
        # checked once per stream; without the token every call fails 401 as a reply (aborting the
        # stream instead races the client's first write, which then sees a transport error)
        allowed = self.policy.auth.allows(bearer_of(context.invocation_metadata()))
        _, traceparent = request_id.from_metadata(context.invocation_metadata())
        client, conn = peer_host(context)

        async def one(request):   # each call is a request of its own: own id, span, access-log line, slot
            with request_scope.observed("grpc", "decide", None, traceparent, operation=_OPERATION["DecideStream"]):
                if not allowed:
                    self.policy.auth.check(None)
                async with self.policy.admission.enter(client, conn) as ticket:
                    return await self._decide(request, ticket, None)
        await calls.serve_calls(request_iterator, context, one,
                                decision_pb2.DecideReply, tokens_pb2.CallError, "Decide", STREAM_MAX_CALLS)

    async def _decide(self, request, ticket: Ticket, context):
        self.policy.admission.trim.add(request.ByteSize())   # ~0.5 ms per MiB: small beside the work it measures
        body = decide_body(request)
        req = parse_decide(body.value, self.decider.route_table, self.max_token_budget, body.may_hold_surrogate)
        await ticket.charge(rows_of(1, len(req.questions)))
        t0 = time.perf_counter()
        decision = await self.decider.decide(req)
        resp = decision_pb2.DecideResponse(inference_ms=(time.perf_counter() - t0) * 1e3)
        if request.include_json:
            resp.json = render_json(decision.body()).decode("utf-8")   # first: a NaN is its 422 here too
        pack_decision(decision, resp)
        _say_unknown_model(req.controls, context)
        return resp

    @rpc.servicer_errors
    async def DecideBatch(self, request, context):
        with request_scope.observed("grpc", "batch", *request_id.from_metadata(context.invocation_metadata()),
                                    operation=_OPERATION["DecideBatch"]) as scope, \
                deadline.within(context.time_remaining()):
            scope.expired = _expired(context)
            await context.send_initial_metadata(((request_id.HEADER, scope.request_id),))
            async with self.policy.admission.enter(*peer_host(context)) as ticket:
                return await self._decide_batch(request, ticket, context)

    async def _decide_batch(self, request, ticket: Ticket, context):
        self.policy.admission.trim.add(request.ByteSize())
        body = batch_body(request)
        req = parse_batch(body.value, self.decider.route_table, self.max_token_budget, body.may_hold_surrogate)
        await ticket.charge(rows_of(len(req.states), len(req.questions)))
        t0 = time.perf_counter()
        decisions = await self.decider.decide_batch(req)
        resp = decision_pb2.DecideBatchResponse(inference_ms=(time.perf_counter() - t0) * 1e3)
        if request.include_json:
            resp.json = render_json(decisions.body()).decode("utf-8")
        pack_batch(decisions, resp)
        _say_unknown_model(req.controls, context)
        return resp


class StatusServicer(decision_pb2_grpc.StatusServiceServicer):
    """Pushes the state of every service and checkpoint on change, with heartbeats in between."""

    def __init__(self, watch, readiness: Readiness, feed: ChangeFeed, address: str, heartbeat_s: float = 2.0):
        self.watch, self.readiness, self.feed = watch, readiness, feed   # watch: engine/backends.py BackendWatch
        self.address, self.heartbeat_s = address, heartbeat_s
        self._last = None   # (key, event): the last event built for the status streams

    def event(self, reason: str) -> decision_pb2.StatusEvent:
        ev = decision_pb2.StatusEvent(sequence=self.feed.sequence, time_unix=time.time(),
                                      ready=self.readiness.ready(), reason=reason)
        ev.services.add(service="gateway", state=S.STATE_READY if ev.ready else S.STATE_STARTING,
                        detail=self.readiness.warm_detail,
                        instance_id=self.feed.instance_id, sequence=self.feed.sequence, time_unix=ev.time_unix,
                        started_unix=self.feed.started, address=self.address)
        for b in self.watch.backends:
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
            await context.write(self._shared_event("change" if changed else "heartbeat"))

    def _shared_event(self, reason: str) -> decision_pb2.StatusEvent:
        """The event of this change or tick, built once for all the streams it wakes (they wake
        one after another from one shared future: feed.wait)."""
        key = (self.feed.sequence, reason, round(time.monotonic(), 2))
        if self._last is None or self._last[0] != key:
            self._last = (key, self.event(reason))
        return self._last[1]
