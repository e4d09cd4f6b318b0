"""The gateway's readiness: grpc.health.v1 SERVING exactly while everything behind it is ready.

Follows the backends' change feed (RemoteServices bumps it on every health or status change);
each time the backends become ready it first warms the gateway's own path (gateway/warmup.py),
then flips health, the ready gauge and the status stream together.
"""
from __future__ import annotations

import logging

from laya_grpc.core import metrics, rpc
from laya_grpc.core.lifecycle import ChangeFeed
from laya_proto.v1 import decision_pb2

from .warmup import warm_up

log = logging.getLogger("gateway")
DECISION_SERVICE = decision_pb2.DESCRIPTOR.services_by_name["DecisionService"].full_name
STATUS_SERVICE = decision_pb2.DESCRIPTOR.services_by_name["StatusService"].full_name


async def follow_readiness(services, feed: ChangeFeed, app, api_key, hs) -> None:
    """grpc.health.v1 on the gateway flips with real readiness of everything behind it.
    Each time the backends become ready, one request per warm checkpoint goes through the
    whole path first, so the first client request after ready is not the one that pays."""
    seen, serving = -1, None
    while True:
        await feed.wait(seen, 5.0)
        seen = feed.sequence
        if services.backends_ready() and not services.warm:
            services.warm_detail = await warm_up(app, services.ready_checkpoints(), api_key,
                                                 len(services.tokenizers))
            services.warm = True
            feed.bump()   # status subscribers see the gateway turn ready now, not at their next heartbeat
        elif not services.backends_ready():
            services.warm = False
        ready = services.ready()
        metrics.GATEWAY_READY.set(1 if ready else 0)
        if ready != serving:
            serving = ready
            await rpc.set_health(hs, [DECISION_SERVICE, STATUS_SERVICE], ready)
            log.info("gateway %s", "READY" if ready else "not ready")
