"""`Services` over gRPC: the tokenizer and inference services as the gateway sees them.

Besides forwarding calls, it watches each backend (grpc.health.v1 Watch and the inference
service's WatchStatus) so the gateway's readiness, /health and status stream always report
what the backends say right now: a killed child shows as down at once, and as ready again
when its replacement has warmed up.
"""
from __future__ import annotations

import asyncio
import itertools
import json
import logging
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc

from laya_grpc.core import rpc, streams
from laya_grpc.core.lifecycle import ChangeFeed
from laya_grpc.core.packed_rows import PackedRows
from laya_proto.v1 import inference_pb2, inference_pb2_grpc, status_pb2, tokenizer_pb2, tokenizer_pb2_grpc
from laya_grpc.core.question_wire import question_to_text

from .coalesce import InferCoalescer
from .services import CheckpointInfo, InferResult

log = logging.getLogger("laya_grpc.gateway.remote")
S = status_pb2
TOKENIZER_SERVICE = tokenizer_pb2.DESCRIPTOR.services_by_name["TokenizerService"].full_name
INFERENCE_SERVICE = inference_pb2.DESCRIPTOR.services_by_name["InferenceService"].full_name


@dataclass
class Encoded:
    rows: PackedRows      # this state's rows, question order
    usage: dict


@dataclass
class Backend:
    """One backend process as observed from here."""
    service: str          # "tokenizer" | "inference"
    address: str
    channel: grpc.aio.Channel
    serving: bool = False
    state: int = S.STATE_STARTING
    detail: str = "connecting"
    downs: int = 0        # times seen going down after having served
    status: Optional[status_pb2.ServiceStatus] = None   # inference only: its latest WatchStatus


class RemoteServices:
    def __init__(self, tokenizer_addresses: Sequence[str], inference_address: str, feed: ChangeFeed,
                 tokenize_timeout_s: float = 30.0, infer_timeout_s: float = 600.0, internal_calls: str = "stream"):
        self.feed = feed
        self.tokenizers = [Backend("tokenizer", a, rpc.channel(a)) for a in tokenizer_addresses]
        self.inference = Backend("inference", inference_address, rpc.channel(inference_address))
        self._tok_calls = [streams.caller(internal_calls, tokenizer_pb2_grpc.TokenizerServiceStub(b.channel),
                                          "Tokenize", "TokenizeStream", tokenizer_pb2.TokenizeCall, "tokenizer service")
                           for b in self.tokenizers]
        self._rr = itertools.cycle(range(len(self.tokenizers)))
        self._inf = inference_pb2_grpc.InferenceServiceStub(self.inference.channel)
        self._inf_call = streams.caller(internal_calls, self._inf, "Infer", "InferStream", inference_pb2.InferCall,
                                        "inference service")
        self.tokenize_timeout_s, self.infer_timeout_s = tokenize_timeout_s, infer_timeout_s
        self._tasks: list[asyncio.Task] = []
        self._coalescer = InferCoalescer(self._infer_call)
        self._infos: dict = {}   # name -> (config_json, CheckpointInfo)
        self.warm = False        # set by the gateway after a warm-up request through every ready checkpoint
        self.warm_detail = "not warmed up yet"   # what the last warm-up did (the status stream shows it)

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        for b in self.tokenizers:
            self._tasks.append(asyncio.ensure_future(self._watch_health(b, TOKENIZER_SERVICE)))
        self._tasks.append(asyncio.ensure_future(self._watch_health(self.inference, INFERENCE_SERVICE)))
        self._tasks.append(asyncio.ensure_future(self._watch_inference_status()))

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        for m in self._tok_calls + [self._inf_call]:
            await m.close()
        for b in self.tokenizers + [self.inference]:
            await b.channel.close()

    @property
    def backends(self) -> list[Backend]:
        return self.tokenizers + [self.inference]

    def backends_ready(self) -> bool:
        """Every backend serving and every checkpoint the inference service preloads is warm."""
        if not all(b.serving for b in self.backends):
            return False
        st = self.inference.status
        return st is not None and st.state == S.STATE_READY

    def ready(self) -> bool:
        """Backends ready and the gateway's own path (channels, tokenizer, decode) warmed through them."""
        return self.warm and self.backends_ready()

    def ready_checkpoints(self) -> list:
        st = self.inference.status
        return [c.name for c in st.checkpoints if c.state == S.STATE_READY] if st is not None else []

    async def _watch_health(self, b: Backend, service: str) -> None:
        stub = health_pb2_grpc.HealthStub(b.channel)
        while True:
            try:
                async for resp in stub.Watch(health_pb2.HealthCheckRequest(service=service)):
                    self._mark(b, resp.status == health_pb2.HealthCheckResponse.SERVING,
                               "" if resp.status == health_pb2.HealthCheckResponse.SERVING else "not serving yet")
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as e:
                self._mark(b, False, "unreachable: %s" % (e.details() or e.code().name), down=True)
            await asyncio.sleep(0.2)

    async def _watch_inference_status(self) -> None:
        while True:
            try:
                async for st in self._inf.WatchStatus(status_pb2.StatusRequest(heartbeat_s=2.0)):
                    changed = self.inference.status is None or st.sequence != self.inference.status.sequence \
                        or st.instance_id != self.inference.status.instance_id
                    self.inference.status = st
                    if changed:
                        self.feed.bump()
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError:
                if self.inference.status is not None:
                    self.inference.status = None
                    self.feed.bump()
            await asyncio.sleep(0.2)

    def _mark(self, b: Backend, serving: bool, detail: str, down: bool = False) -> None:
        state = S.STATE_READY if serving else (S.STATE_DOWN if down else S.STATE_STARTING)
        if b.serving and not serving:
            b.downs += 1
            log.warning("%s at %s went down: %s", b.service, b.address, detail)
        elif serving and not b.serving:
            log.info("%s at %s is serving", b.service, b.address)
        if (b.serving, b.state, b.detail) != (serving, state, detail):
            b.serving, b.state, b.detail = serving, state, detail
            self.feed.bump()

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
        if st is None or st.state != S.STATE_READY or not st.config_json:
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

    def _checkpoint_status(self, name: str):
        st = self.inference.status
        if st is None:
            return None
        for c in st.checkpoints:
            if c.name == name:
                return c
        return None

    def health(self) -> dict:
        """Live facts for /health (upstream's fields are filled by the HTTP app from these)."""
        st = self.inference.status
        cps = list(st.checkpoints) if st is not None else []
        loaded = [c for c in cps if c.state == S.STATE_READY]
        devices = {c.name: c.device for c in loaded}
        actual = next(iter(devices.values()), None)
        preference = cps[0].device_requested if cps else "unknown"
        return {
            "ready": self.ready(),
            "loaded": [c.name for c in loaded],
            "revisions": {c.name: c.revision for c in loaded},
            "device": actual or preference,
            "device_is_preference": actual is None,
            "checkpoint_devices": devices,
            # upstream counts per-request GPU->CPU retries here; we never retry on another device
            "cpu_fallbacks": {c.name: {"count": 0, "last_reason": None} for c in loaded},
            "checkpoints": {c.name: {"state": S.State.Name(c.state).removeprefix("STATE_").lower(), "device": c.device, "dtype": c.dtype,
                                     "backend": c.backend, "kernels": c.kernels, "rows": c.row_layout,
                                     "revision": c.revision, "sha256": c.sha256,
                                     "warmup_ms": round(c.warmup_ms, 1), "load_ms": round(c.load_ms, 1),
                                     "device_requested": c.device_requested, "device_fallback": c.device_fallback,
                                     "detail": c.detail} for c in cps},
            "preparing": [c.name for c in cps if c.state == S.STATE_PREPARING],
            "services": {("%s@%s" % (b.service, b.address)): {"state": S.State.Name(b.state).removeprefix("STATE_").lower(),
                                                              "detail": b.detail, "restarts_seen": b.downs}
                         for b in self.backends},
            "queue_depth": st.queue_depth if st is not None else 0,
        }
