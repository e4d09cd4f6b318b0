"""The gateway's readiness: grpc.health.v1 SERVING exactly while everything behind it is ready.

`Readiness` owns the gateway's own part (warmed up through the backends, draining) and reads the
backends' part from their watch (`backends_ready()`); /ready, /health, the status stream and
grpc.health.v1 all ask it. `follow_readiness` follows the backends' change feed; each time the
backends become ready it first warms the gateway's own path (gateway/warmup.py), then flips
health, the ready gauge and the status stream together.
"""
from __future__ import annotations

import logging
import re

from laya_grpc.core.runtime import metrics
from laya_grpc.core.wire import rpc
from laya_grpc.core.runtime.lifecycle import ChangeFeed
from laya_proto.v1 import decision_pb2, status_pb2

from .warmup import warm_up

log = logging.getLogger("gateway")
DECISION_SERVICE = decision_pb2.DESCRIPTOR.services_by_name["DecisionService"].full_name
STATUS_SERVICE = decision_pb2.DESCRIPTOR.services_by_name["StatusService"].full_name
S = status_pb2


_SOCKET_PATH = re.compile(r"(unix:|ipc:)?/+[^\s,;:()'\"]*")


def _where(address: str) -> str:
    """A backend's address as a reason shows it: host:port, never a local socket's path."""
    if address.startswith(("unix:", "/", "ipc:")):
        return "local socket"
    return address


def _scrub(detail: str) -> str:
    """A backend's state as a reason shows it: gRPC's own text names socket paths; they go."""
    return _SOCKET_PATH.sub("local socket", detail)


class Readiness:
    """Ready = the backends ready, the gateway's path warmed through them, and not draining."""

    def __init__(self, backends):
        self.backends = backends          # the watch of the tokenizer and inference services
        self.warm = False                 # a warm-up request went through every ready checkpoint
        self.warm_detail = "not warmed up yet"   # what the last warm-up did (the status stream shows it)
        self.draining = False             # set on SIGTERM: not ready from then on

    def ready(self) -> bool:
        return self.warm and not self.draining and self.backends.backends_ready()

    def reason(self) -> str:
        """Why `ready()` is False, in one line for GET /ready ("" when ready)."""
        if self.draining:
            return "draining: shutting down"
        b = self.backends
        if not any(t.serving for t in b.tokenizers):
            return "no tokenizer serving (%s)" % "; ".join("%s: %s" % (_where(t.address), _scrub(t.detail))
                                                          for t in b.tokenizers)
        if not b.backends_ready():
            def state(i):
                if not i.serving or i.status is None:
                    return _scrub(i.detail)
                return S.State.Name(i.status.state).removeprefix("STATE_").lower() + (
                    ": " + i.status.detail if i.status.detail else "")
            return "no inference replica serving with its checkpoints ready (%s)" % "; ".join(
                "%s: %s" % (_where(i.address), state(i)) for i in b.inferences)
        if not self.warm:
            return "warming up: %s" % self.warm_detail
        return ""


async def follow_readiness(readiness: Readiness, feed: ChangeFeed, app, api_key, hs) -> None:
    """grpc.health.v1 on the gateway flips with real readiness of everything behind it.
    Each time the backends become ready, one request per warm checkpoint goes through the
    whole path first, so the first client request after ready is not the one that pays."""
    backends = readiness.backends
    seen, serving = -1, None
    while True:
        await feed.wait(seen, 5.0)
        seen = feed.sequence
        if backends.backends_ready() and not readiness.warm:
            readiness.warm_detail = await warm_up(app, backends.ready_checkpoints(), api_key,
                                                  len(backends.tokenizers))
            readiness.warm = True
            feed.bump()   # status subscribers see the gateway turn ready now, not at their next heartbeat
        elif not backends.backends_ready():
            readiness.warm = False
        ready = readiness.ready()
        metrics.GATEWAY_READY.set(1 if ready else 0)
        if ready != serving:
            serving = ready
            await rpc.set_health(hs, [DECISION_SERVICE, STATUS_SERVICE], ready)
            log.info("gateway %s", "READY" if ready else "not ready")
