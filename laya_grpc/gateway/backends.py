"""The tokenizer and inference processes as the gateway observes them.

It watches each backend (grpc.health.v1 Watch and the inference service's WatchStatus) so the
gateway's readiness, /health and status stream always report what the backends say right now: a
killed child shows as down at once, and as ready again when its replacement has warmed up.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Optional, Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from laya_grpc.core import rpc
from laya_grpc.core.lifecycle import ChangeFeed
from laya_proto.v1 import inference_pb2, inference_pb2_grpc, status_pb2, tokenizer_pb2

log = logging.getLogger("laya_grpc.gateway.backends")
S = status_pb2
TOKENIZER_SERVICE = tokenizer_pb2.DESCRIPTOR.services_by_name["TokenizerService"].full_name
INFERENCE_SERVICE = inference_pb2.DESCRIPTOR.services_by_name["InferenceService"].full_name


@dataclass
class Backend:
    """One backend process as observed from here."""
    service: str          # "tokenizer" | "inference"
    address: str
    channel: grpc.aio.Channel
    serving: bool = False
    state: int = S.STARTING
    detail: str = "connecting"
    downs: int = 0        # times seen going down after having served
    status: Optional[status_pb2.ServiceStatus] = None   # inference only: its latest WatchStatus


class BackendWatch:
    """Channels to the backends and their live state; `RemoteServices` adds the calls."""

    def __init__(self, tokenizer_addresses: Sequence[str], inference_address: str, feed: ChangeFeed):
        self.feed = feed
        self.tokenizers = [Backend("tokenizer", a, rpc.channel(a)) for a in tokenizer_addresses]
        self.inference = Backend("inference", inference_address, rpc.channel(inference_address))
        self._inf = inference_pb2_grpc.InferenceServiceStub(self.inference.channel)
        self._tasks: list[asyncio.Task] = []
        self.warm = False        # set by the gateway after a warm-up request through every ready checkpoint
        self.warm_detail = "not warmed up yet"   # what the last warm-up did (the status stream shows it)

    def start(self) -> None:
        for b in self.tokenizers:
            self._tasks.append(asyncio.ensure_future(self._watch_health(b, TOKENIZER_SERVICE)))
        self._tasks.append(asyncio.ensure_future(self._watch_health(self.inference, INFERENCE_SERVICE)))
        self._tasks.append(asyncio.ensure_future(self._watch_inference_status()))

    @property
    def backends(self) -> list[Backend]:
        return self.tokenizers + [self.inference]

    def backends_ready(self) -> bool:
        """Every backend serving and every checkpoint the inference service preloads is warm."""
        if not all(b.serving for b in self.backends):
            return False
        st = self.inference.status
        return st is not None and st.state == S.READY

    def ready(self) -> bool:
        """Backends ready and the gateway's own path (channels, tokenizer, decode) warmed through them."""
        return self.warm and self.backends_ready()

    def ready_checkpoints(self) -> list:
        st = self.inference.status
        return [c.name for c in st.checkpoints if c.state == S.READY] if st is not None else []

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
        state = S.READY if serving else (S.DOWN if down else S.STARTING)
        if b.serving and not serving:
            b.downs += 1
            log.warning("%s at %s went down: %s", b.service, b.address, detail)
        elif serving and not b.serving:
            log.info("%s at %s is serving", b.service, b.address)
        if (b.serving, b.state, b.detail) != (serving, state, detail):
            b.serving, b.state, b.detail = serving, state, detail
            self.feed.bump()

    def _checkpoint_status(self, name: str):
        st = self.inference.status
        if st is None:
            return None
        for c in st.checkpoints:
            if c.name == name:
                return c
        return None
