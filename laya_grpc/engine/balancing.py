"""A channel that gRPC balances over a backend's replicas.

The service config asks gRPC for `round_robin` over every resolved address, with client-side
health checking (`healthCheckConfig`): each subchannel watches `grpc.health.v1` of the backend's
service, and a replica that is not SERVING (starting, loading, warming, draining, dead) gets no
new calls. A call that fails UNAVAILABLE (a replica killed mid-call, or one that stopped between
the pick and the call) is retried once; round_robin picks the next replica. Retries stay inside
the call's deadline (gRPC counts every attempt against it). Decisions are pure functions of
(checkpoint, rows), so running a call again can only give the same answer, and each attempt's
reply belongs to that call alone.
"""
from __future__ import annotations

import json

import grpc

from laya_grpc.core import rpc

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
