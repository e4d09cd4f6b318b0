"""A channel that gRPC balances over a backend's replicas.

The service config asks gRPC for `round_robin` over every resolved address, with client-side
health checking (`healthCheckConfig`): each subchannel watches `grpc.health.v1` of the backend's
service, and a replica that is not SERVING (starting, loading, warming, draining, dead) gets no
new calls. A call that fails UNAVAILABLE (a replica killed mid-call, or one that stopped between
the pick and the call) is retried once; round_robin picks the next replica. Retries stay inside
the call's deadline (gRPC counts every attempt against it). Decisions are pure functions of
(checkpoint, rows), so running a call again can only give the same answer, and each attempt's
reply belongs to that call alone.

A call that fails INTERNAL (the replica's device failed its forward: a lost GPU, a CUDA error, out
of memory) is also run once more, by `once_more`, on the replica the balancer picks next, within
what is left of the call's deadline, and counted (`laya_gateway_backend_retries_total`); the
failing replica meanwhile probes its device and turns NOT_SERVING if it is broken
(inference/outcomes.py), after which it gets no calls at all.
"""
from __future__ import annotations

import json
import time
from typing import Awaitable, Callable, Optional

import grpc

from laya_grpc.core.runtime import metrics
from laya_grpc.core.wire import rpc
from laya_grpc.core.errors import Kind, LayaError

RETRY_POLICY = {
    "maxAttempts": 2,                     # the call and one retry on another replica
    "initialBackoff": "0.01s",
    "maxBackoff": "0.1s",
    "backoffMultiplier": 2,
    "retryableStatusCodes": ["UNAVAILABLE"],
}


def service_config(service_name: str) -> str:
    return json.dumps({
        "loadBalancingConfig": [{"round_robin": {}}],
        "healthCheckConfig": {"serviceName": service_name},
        "methodConfig": [{"name": [{}], "retryPolicy": RETRY_POLICY}],
    })


def balanced_channel(target: str, service_name: str) -> grpc.aio.Channel:
    options = [o for o in rpc.CHANNEL_OPTIONS if o[0] != "grpc.enable_retries"] + [
        ("grpc.enable_retries", 1),
        ("grpc.service_config", service_config(service_name)),
        ("grpc.service_config_disable_resolution", 1),   # ours, not one a DNS TXT record might carry
        # a call is kept for its retry up to this size (gRPC's default, 256 KiB, is below a large batch)
        ("grpc.per_rpc_retry_buffer_size", rpc.MAX_MESSAGE_BYTES),
    ]
    return grpc.aio.insecure_channel(target, options=options)


# kinds of failure that another replica may not repeat: refused (busy, draining, gone) or internal
RETRIED_KINDS = (Kind.BUSY, Kind.INTERNAL)


async def once_more(attempt: Callable[[Optional[float], bool], Awaitable], timeout: Optional[float],
                    service: str, kinds=(Kind.INTERNAL,)):
    """`attempt(timeout, retry)`, and once more with the time left if it failed with one of `kinds`
    (the retry counted by service and reason)."""
    t0 = time.monotonic()
    try:
        return await attempt(timeout, False)
    except LayaError as e:
        left = None if timeout is None else timeout - (time.monotonic() - t0)
        if e.kind not in kinds or (left is not None and left <= 0):
            raise
        metrics.BACKEND_RETRIES.labels(service, e.kind.name.lower()).inc()
        return await attempt(left, True)


def count_error(service: str, replica: str, e: LayaError) -> None:
    metrics.BACKEND_ERRORS.labels(service, replica, e.kind.name.lower()).inc()
