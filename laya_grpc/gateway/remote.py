"""`Services` over gRPC: the calls to the tokenizer and inference services.

Tokenize and Infer go over one multiplexed stream per backend (core/streams.py); Infer calls of
concurrent requests are merged first (coalesce.py). What the gateway observes of the backends
(health, status, readiness) is `BackendWatch` (backends.py); the /health payload is health.py.
"""
from __future__ import annotations

import itertools
import json
from typing import Any, Optional, Sequence

import grpc
import numpy as np

from laya_grpc.core import ipc, rpc, streams, timing
from laya_grpc.core.lifecycle import ChangeFeed
from laya_grpc.core.packed_rows import PackedRows
from laya_grpc.core.question_wire import question_to_text
from laya_proto.v1 import inference_pb2, status_pb2, tokenizer_pb2, tokenizer_pb2_grpc

from .backends import BackendWatch
from .coalesce import InferCoalescer
from .health import health_payload
from .services import CheckpointInfo, Encoded, InferResult

S = status_pb2


class RemoteServices(BackendWatch):
    def __init__(self, tokenizer_addresses: Sequence[str], inference_address: str, feed: ChangeFeed,
                 tokenize_timeout_s: float = 30.0, infer_timeout_s: float = 600.0):
        tok_links, inf_link = [ipc.Link.parse(a) for a in tokenizer_addresses], ipc.Link.parse(inference_address)
        super().__init__([t.grpc for t in tok_links], inf_link.grpc, feed)
        self._tok_calls = [ipc.call_mux(t, lambda b=b: streams.StreamMux(
            tokenizer_pb2_grpc.TokenizerServiceStub(b.channel).TokenizeStream, tokenizer_pb2.TokenizeCall,
            "tokenizer service"), tokenizer_pb2.TokenizeCall, tokenizer_pb2.TokenizeReply, "tokenizer service")
            for t, b in zip(tok_links, self.tokenizers)]
        self._rr = itertools.cycle(range(len(self.tokenizers)))
        self._inf_call = ipc.call_mux(inf_link, lambda: streams.StreamMux(
            self._inf.InferStream, inference_pb2.InferCall, "inference service"),
            inference_pb2.InferCall, inference_pb2.InferReply, "inference service")
        self.tokenize_timeout_s, self.infer_timeout_s = tokenize_timeout_s, infer_timeout_s
        self._coalescer = InferCoalescer(self._infer_call)
        self._infos: dict = {}   # name -> (config_json, CheckpointInfo)

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        for m in self._tok_calls + [self._inf_call]:
            await m.close()
        for b in self.tokenizers + [self.inference]:
            await b.channel.close()

    # -- Services -------------------------------------------------------------------------
    async def tokenize(self, checkpoint: str, states: Sequence[Any], questions: Sequence[Any],
                       max_len: Optional[int], head_max_len: Optional[int]) -> list[Encoded]:
        req = tokenizer_pb2.TokenizeRequest(checkpoint=checkpoint,
                                            states_json=[json.dumps(s, ensure_ascii=False) for s in states])
        for q in questions:
            question_to_text(q, req.questions.add())
        if max_len is not None:
            req.max_len = max_len
        if head_max_len is not None:
            req.head_max_len = head_max_len
        resp = await self._tok_calls[next(self._rr)].call(req, self.tokenize_timeout_s)
        timing.add("tokenize_server", resp.tokenize_ms)
        rows = PackedRows.from_proto(resp.rows)
        per = resp.rows_per_state
        return [Encoded(rows.take(range(k * per, (k + 1) * per)), json.loads(u))
                for k, u in enumerate(resp.usage_json)]

    async def infer(self, checkpoint: str, rows) -> InferResult:
        packed = PackedRows.concat(list(rows)) if isinstance(rows, (list, tuple)) else rows
        st = self._checkpoint_status(checkpoint)
        if st is not None and st.max_row_tokens:   # refuse here: in a shared Infer call it would fail the others
            packed.check_max_len(st.max_row_tokens)   # the rest was validated when the tokenizer's reply came in
        resp, merged, start = await self._coalescer.submit(checkpoint, packed)
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
        rows.to_proto(req.rows)
        return await self._inf_call.call(req, self.infer_timeout_s)

    async def checkpoint(self, name: str) -> CheckpointInfo:
        st = self._checkpoint_status(name)
        if st is None or st.state != S.READY or not st.config_json:
            try:
                st = await self._inf.LoadCheckpoint(inference_pb2.LoadCheckpointRequest(checkpoint=name),
                                                    timeout=self.infer_timeout_s)
            except grpc.aio.AioRpcError as e:
                raise rpc.error_from_rpc(e, "inference service") from None
        cached = self._infos.get(st.name)
        if cached is None or cached[0] != st.config_json:   # parse a checkpoint's config once, not per request
            cached = self._infos[st.name] = (st.config_json, CheckpointInfo(
                name=st.name, config=json.loads(st.config_json), revision=st.revision, sha256=st.sha256))
        return cached[1]

    def health(self) -> dict:
        return health_payload(self)
