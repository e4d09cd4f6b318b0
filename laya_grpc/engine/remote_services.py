"""`Services` over the internal contract: the calls to the tokenizer and inference services.

Every Tokenize and Infer call goes through one call multiplexer per backend replica
(core/wire/calls.py `CallMux`): framed messages on a unix socket for `ipc://` endpoints (serve's own
children, core/wire/ipc.py), a long-lived gRPC stream for the other endpoints (on one host most of a
unary call's cost is setting it up), or, for a `dns:///` name that only gRPC can resolve, unary
calls on a channel gRPC balances (balancing.py). `Replicas` picks the replica of each call.
Backends are watched over their gRPC addresses (`BackendWatch`, backends.py; the /health payload
is health.py). Infer calls of concurrent requests are merged first (coalesce.py). Every call asks
for at most the time left to its request (deadline.py).
"""
from __future__ import annotations

import asyncio
import contextvars
from typing import Any, Optional, Sequence

import grpc
import numpy as np

from laya_grpc.core.runtime import request_id, timing, tracing
from laya_grpc.core.wire import calls, ipc, rpc
from laya_grpc.core.errors import LayaError
from laya_grpc.core.runtime.lifecycle import ChangeFeed
from laya_grpc.core.wire.packed_rows import PackedRows
from laya_grpc.core.decisions.answers import Usage
from laya_grpc.core.wire.question_wire import StateText, question_to_text, state_of
from laya_grpc.core.decisions.temperatures import Temperatures
from laya_proto.internal.v1 import inference_pb2, inference_pb2_grpc, tokenizer_pb2, tokenizer_pb2_grpc
from laya_proto.v1 import status_pb2

from . import balancing, coalesce, deadline
from .backends import BackendWatch
from .coalesce import InferCoalescer
from .endpoints import BackendTarget, parse_target
from .health import health_payload
from .services import Encoded, InferResult

S = status_pb2
# The task of the request whose context this is. An Infer call carries that request's deadline only
# when it runs in that task, which then sends that request's rows alone (coalesce.py): a call that
# merges several requests' rows runs in a helper task
# (a context copied from another request, possibly one long answered), so it is bounded by
# infer_timeout_s and each of its requests by its own backend calls.
_OWN_TASK: contextvars.ContextVar = contextvars.ContextVar("laya_own_task", default=None)


# Token arrays one Tokenize reply may carry. A batch whose rows would make a larger reply (the
# largest the HTTP limits admit is about 134 MB of token ids) is tokenized in several calls, by
# states, one call after another, so no reply nears the internal message limit and other requests'
# tokenize calls take turns with the large one's.
TOKENIZE_REPLY_BUDGET = min(16 * 1024 * 1024, rpc.MAX_MESSAGE_BYTES // 4)
_BYTES_PER_TOKEN = 12   # ids, and for parallel-option checkpoints position and option ids (int32 each)


def reply_groups(states: Sequence[StateText], texts: Sequence[Any], row_cap: int,
                 budget: int = TOKENIZE_REPLY_BUDGET) -> list:
    """Consecutive groups of state indices whose Tokenize replies stay within the budget. A row's
    tokens are bounded by its characters (UTF-8 bytes) and by the row cap, when known."""
    longest_q = max((t.ByteSize() for t in texts), default=0) + 16
    groups, cur, size = [], [], 0
    for i, s in enumerate(states):
        row = len(s.text.encode("utf-8", "surrogatepass")) + longest_q
        est = len(texts) * (min(row, row_cap) if row_cap else row) * _BYTES_PER_TOKEN
        if cur and size + est > budget:
            groups.append(cur)
            cur, size = [], 0
        cur.append(i)
        size += est
    return groups + [cur] if cur else groups or [[]]


def _links(target: BackendTarget) -> list:
    """The ipc:// links of a backend given as ipc:///PATH?grpc=ADDRESS endpoints; [] for gRPC."""
    return [ipc.Link.parse(e) for e in target.endpoints] if target.scheme == "ipc" else []


def _watched(target: BackendTarget, links: list, flag: str) -> BackendTarget:
    """What BackendWatch watches: for IPC links, their gRPC addresses (health, status)."""
    return parse_target([link.grpc for link in links], flag) if links else target


def _muxes(links: list, backends: list, stub_cls, method: str, call_cls, reply_cls, what: str) -> list:
    """One call multiplexer per replica: on its unix socket (`ipc://` links), else on a gRPC stream
    of the replica's channel (`<method>Stream`); a `dns:///` backend, whose replicas only gRPC's
    balanced channel knows, gets one whose calls are unary calls on that channel (balancing.py)."""
    if links:
        return [ipc.mux(link.ipc, call_cls, reply_cls, what) for link in links]
    return [calls.CallMux(calls.UnaryTransport(getattr(stub_cls(b.channel), method), what), call_cls) if b.balanced
            else calls.stream_mux(getattr(stub_cls(b.channel), method + "Stream"), call_cls, what) for b in backends]


class Replicas:
    """Calls to one or more replicas of a backend, each over its own `CallMux`. A call goes to the
    first replica in list order that reports SERVING and has no call of this gateway in flight, else
    to the serving one with the fewest (all of them count when none is serving, so the error names
    the cause). A call refused as busy, or failed by the replica's device (internal), is tried once
    more on another serving replica within its deadline (balancing.py), and errors are counted per
    replica.

    Why first-idle rather than taking turns: a lone stream of requests then stays on one process,
    whose caches, allocator and threads stay warm, instead of waking each of n idle processes in
    turn (docs/performance.md, Local transports); concurrent calls still spread over all of them.
    `serve` hands each gateway worker the list rotated by its index, so the workers' first choices
    differ."""

    def __init__(self, muxes: list, backends: list, what: str):
        self._muxes, self.what = muxes, what
        # parse_target keeps the order of the endpoints, so backend i watches replica i
        self._backends = backends if len(backends) == len(muxes) else [None] * len(muxes)
        self._names = [b.address if b is not None else what for b in self._backends]   # error counters' label
        # a dns:/// name's one balanced channel spreads its calls: a retry on it reaches another replica
        self._retry_alone = len(muxes) == 1 and getattr(self._backends[0], "balanced", False)
        self._inflight = [0] * len(muxes)

    def _pick(self, skip: int = -1) -> int:
        n = len(self._muxes)
        others = [i for i in range(n) if i != skip] or list(range(n))
        serving = [i for i in others if self._backends[i] is None or self._backends[i].serving]
        return min(serving or others, key=self._inflight.__getitem__)   # min keeps list order on ties

    async def call(self, request, timeout: Optional[float] = None):
        first = self._pick()
        if len(self._muxes) == 1 and not self._retry_alone:
            return await self._call_on(first, request, timeout)

        async def attempt(left: Optional[float], retry: bool):   # a retry goes to another replica
            return await self._call_on(self._pick(skip=first) if retry else first, request, left)
        return await balancing.once_more(attempt, timeout, self.what.split()[0], balancing.RETRIED_KINDS)

    async def _call_on(self, i: int, request, timeout: Optional[float]):
        self._inflight[i] += 1
        try:
            return await self._muxes[i].call(request, timeout)
        except LayaError as e:
            balancing.count_error(self.what.split()[0], self._names[i], e)
            raise
        finally:
            self._inflight[i] -= 1

    async def close(self) -> None:
        for m in self._muxes:
            await m.close()


class RemoteServices:
    """`Services` over the backend processes. `watch` (BackendWatch) observes them: the gateway's
    readiness, status stream and /health read it, and `Replicas` skips a replica it sees down."""

    def __init__(self, tokenizer: BackendTarget, inference: BackendTarget, feed: ChangeFeed,
                 tokenize_timeout_s: float = 30.0, infer_timeout_s: float = 600.0):
        tok_links, inf_links = _links(tokenizer), _links(inference)
        self.watch = watch = BackendWatch(_watched(tokenizer, tok_links, "--tokenizer"),
                                          _watched(inference, inf_links, "--inference"), feed)
        self._tok_call = Replicas(_muxes(tok_links, watch.tokenizers, tokenizer_pb2_grpc.TokenizerServiceStub,
                                         "Tokenize", tokenizer_pb2.TokenizeCall, tokenizer_pb2.TokenizeReply,
                                         "tokenizer service"), watch.tokenizers, "tokenizer service")
        self._inf_call = Replicas(_muxes(inf_links, watch.inferences, inference_pb2_grpc.InferenceServiceStub,
                                         "Infer", inference_pb2.InferCall, inference_pb2.InferReply,
                                         "inference service"), watch.inferences, "inference service")
        self.tokenize_timeout_s, self.infer_timeout_s = tokenize_timeout_s, infer_timeout_s
        self._coalescer = InferCoalescer(self._infer_call)
        self._temperatures: dict = {}   # (name, revision, sha256) -> Temperatures

    def start(self) -> None:
        self.watch.start()

    async def close(self) -> None:
        for m in (self._tok_call, self._inf_call):
            await m.close()
        await self.watch.close()

    # -- Services -------------------------------------------------------------------------
    async def tokenize(self, checkpoint: str, states: Sequence[Any], questions: Sequence[Any],
                       max_len: Optional[int], head_max_len: Optional[int]) -> list[Encoded]:
        states = [state_of(s) for s in states]   # each state's text, rendered once here
        texts = []
        for q in questions:
            texts.append(tokenizer_pb2.QuestionText())
            question_to_text(q, texts[-1])
        if len(states) == 1:   # the usual request: nothing to split (one state's rows stay far below)
            return await self._tokenize(checkpoint, states, questions, texts, max_len, head_max_len)
        st = self.watch.checkpoint_status(checkpoint)
        groups = reply_groups(states, texts, max_len or (st.max_row_tokens if st is not None else 0))
        if len(groups) == 1:
            return await self._tokenize(checkpoint, states, questions, texts, max_len, head_max_len)
        out = []   # one call at a time: other requests' tokenize calls get their turn between them
        for g in groups:
            out += await self._tokenize(checkpoint, [states[i] for i in g], questions, texts, max_len, head_max_len)
        return out

    async def _tokenize(self, checkpoint: str, states: list, questions: Sequence[Any], texts: list,
                        max_len: Optional[int], head_max_len: Optional[int]) -> list[Encoded]:
        req = tokenizer_pb2.TokenizeRequest(checkpoint=checkpoint)
        for s in states:
            req.states.add(text=s.text, keep_end=s.keep_end)
        req.questions.extend(texts)
        if max_len is not None:
            req.max_len = max_len
        if head_max_len is not None:
            req.head_max_len = head_max_len
        req.origin.request_id, req.origin.traceparent = request_id.current_id(), tracing.traceparent()
        resp = await self._tok_call.call(req, deadline.timeout(self.tokenize_timeout_s))
        timing.add("tokenize_server", resp.tokenize_ms)
        rows = PackedRows.from_proto(resp.rows)
        per = resp.rows_per_state
        order = [q.qid for q in questions]
        return [Encoded(rows.take(range(k * per, (k + 1) * per)), Usage.from_proto(u, order))
                for k, u in enumerate(resp.usage)]

    async def infer(self, checkpoint: str, rows) -> InferResult:
        packed = PackedRows.concat(list(rows)) if isinstance(rows, (list, tuple)) else rows
        st = self.watch.checkpoint_status(checkpoint)
        if st is not None and st.max_row_tokens:   # refuse here: in a shared Infer call it would fail the others
            packed.check_max_len(st.max_row_tokens)   # the rest was validated when the tokenizer's reply came in
        token = _OWN_TASK.set(asyncio.current_task())
        try:
            resp, merged, start = await self._coalescer.submit(checkpoint, packed)
        finally:
            _OWN_TASK.reset(token)
        timing.add("queue_wait", resp.queue_ms)
        timing.add("model", resp.model_ms)
        flat = np.frombuffer(resp.logits, dtype="<f4")
        offs = merged.marker_offsets
        n_act = max(1, resp.n_act)
        act = np.frombuffer(resp.act_logits, dtype="<f4").reshape(merged.n, n_act)
        idx = range(start, start + packed.n)
        return InferResult(logits=[flat[offs[i]:offs[i + 1]] for i in idx], act_logits=[act[i] for i in idx])

    async def _infer_call(self, checkpoint: str, rows: PackedRows):
        req = inference_pb2.InferRequest(checkpoint=checkpoint)
        for rid, tp in coalesce.origins():
            req.origins.add(request_id=rid, traceparent=tp)
        rows.to_proto(req.rows)
        own = _OWN_TASK.get() is asyncio.current_task()
        return await self._inf_call.call(req, deadline.timeout(self.infer_timeout_s) if own else self.infer_timeout_s)

    async def temperatures(self, name: str) -> Temperatures:
        st = self.watch.checkpoint_status(name)
        if st is None or st.state != S.STATE_READY or not st.HasField("temperatures"):
            try:
                # the replica whose status stands for all (they serve one checkpoint set)
                stub = inference_pb2_grpc.InferenceServiceStub(self.watch.inference.channel)
                st = await stub.LoadCheckpoint(inference_pb2.LoadCheckpointRequest(checkpoint=name),
                                               timeout=deadline.timeout(self.infer_timeout_s))
            except grpc.aio.AioRpcError as e:
                raise rpc.error_from_rpc(e, "inference service") from None
        key = (st.name, st.revision, st.sha256)
        temps = self._temperatures.get(key)
        if temps is None:   # read once per checkpoint version, not per request
            temps = self._temperatures[key] = Temperatures.from_proto(st.temperatures)
        return temps

    def health(self) -> dict:
        return health_payload(self.watch)
