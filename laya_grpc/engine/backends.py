"""The tokenizer and inference processes as the gateway observes them.

It watches each backend (grpc.health.v1 Watch and the inference service's WatchStatus) so the
gateway's readiness, /health and status stream always report what the backends say right now: a
killed child shows as down at once, and as ready again when its replacement has warmed up.

A backend given as several endpoints is watched replica by replica, each on its own channel, which
also carries that replica's calls (remote_services.py `Replicas` picks one per call). A `dns:///` backend
is one balanced channel (balancing.py), watched and called through it: it reaches a SERVING
replica whenever there is one.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Optional

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from laya_grpc.core.wire import rpc
from laya_grpc.core.errors import Kind, LayaError
from laya_grpc.core.runtime.lifecycle import ChangeFeed
from laya_proto.internal.v1 import inference_pb2, inference_pb2_grpc, tokenizer_pb2
from laya_proto.v1 import status_pb2

from .balancing import balanced_channel
from .endpoints import BackendTarget

log = logging.getLogger("laya_grpc.engine.backends")
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
    state: int = S.STATE_STARTING
    detail: str = "connecting"
    downs: int = 0        # times seen going down after having served
    status: Optional[status_pb2.ServiceStatus] = None   # inference only: its latest WatchStatus
    balanced: bool = False   # a dns:/// name: gRPC balances its channel's calls over the replicas


class BackendWatch:
    """Channels to the backends and their live state (`RemoteServices` holds one and calls through
    its channels)."""

    def __init__(self, tokenizer: BackendTarget, inference: BackendTarget, feed: ChangeFeed):
        self.feed = feed
        self.tokenizers = self._replicas("tokenizer", tokenizer, TOKENIZER_SERVICE)
        self.inferences = self._replicas("inference", inference, INFERENCE_SERVICE)
        self._tasks: list[asyncio.Task] = []

    @staticmethod
    def _replicas(service: str, target: BackendTarget, service_name: str):
        """The Backends watched, one per replica (a dns:/// name is one, on its balanced channel)."""
        if target.scheme == "ipc":
            raise LayaError(Kind.INVALID, "--%s %s: ipc:// endpoints are not served over gRPC" % (service, target.spec))
        if target.scheme == "dns":   # gRPC alone knows the replicas
            return [Backend(service, target.spec, balanced_channel(target.spec, service_name), balanced=True)]
        return [Backend(service, e, rpc.channel(e)) for e in target.endpoints]

    def start(self) -> None:
        for b in self.tokenizers:
            self._tasks.append(asyncio.ensure_future(self._watch_health(b, TOKENIZER_SERVICE)))
        for b in self.inferences:
            self._tasks.append(asyncio.ensure_future(self._watch_health(b, INFERENCE_SERVICE)))
            self._tasks.append(asyncio.ensure_future(self._watch_inference_status(b)))

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        for b in self.backends:
            await b.channel.close()

    @property
    def backends(self) -> list[Backend]:
        return self.tokenizers + self.inferences

    @property
    def inference(self) -> Backend:
        """The inference replica whose status stands for all (they serve one checkpoint set,
        docs/deploy.md): a serving one that is READY, else any serving one, else the first."""
        serving = [b for b in self.inferences if b.serving and b.status is not None]
        ready = [b for b in serving if b.status.state == S.STATE_READY]
        return (ready or serving or self.inferences)[0]

    def backends_ready(self) -> bool:
        """At least one tokenizer replica serving, and at least one inference replica serving with
        every checkpoint it preloads warm (every replica serves the same checkpoint set)."""
        if not any(b.serving for b in self.tokenizers):
            return False
        return any(b.serving and b.status is not None and b.status.state == S.STATE_READY for b in self.inferences)

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

    async def _watch_inference_status(self, b: Backend) -> None:
        stub = inference_pb2_grpc.InferenceServiceStub(b.channel)
        while True:
            try:
                async for st in stub.WatchStatus(status_pb2.StatusRequest(heartbeat_s=2.0)):
                    changed = b.status is None or st.sequence != b.status.sequence \
                        or st.instance_id != b.status.instance_id
                    b.status = st
                    if changed:
                        self.feed.bump()
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError:
                if b.status is not None:
                    b.status = None
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

    def checkpoint_status(self, name: str):
        """The inference service's status of checkpoint `name` (None while unknown)."""
        st = self.inference.status
        if st is None:
            return None
        for c in st.checkpoints:
            if c.name == name:
                return c
        return None

