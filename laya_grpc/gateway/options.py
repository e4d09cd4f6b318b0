"""The gateway's command-line flags (each also an environment variable).

`add_gateway_flags` holds the two that `laya-grpc serve` shares with the gateway.
"""
from __future__ import annotations

import argparse

from laya_grpc.core import draining, flags, metrics
from laya_grpc.core.lifecycle import add_observability_flags

from .http_server import add_flags as add_http_server_flags

# Long enough for a large batch on a CPU-only inference service; short enough that the gateway does
# not keep working for a client that has left (proxies in front commonly give up at 60 s).
DEFAULT_REQUEST_TIMEOUT_S = 60.0


def add_gateway_flags(p: argparse.ArgumentParser) -> None:
    flags.add(p, "--http", env="LAYA_HTTP", default="127.0.0.1:8000",
              help="HOST:PORT for HTTP /v1/systemone, /v1/systemone/batch and /health")
    flags.add(p, "--grpc", env="LAYA_GRPC", default="127.0.0.1:50051",
              help="HOST:PORT (or unix:/path) for the gRPC DecisionService, StatusService and grpc.health.v1")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_gateway_flags(p)
    metrics.add_flag(p, "LAYA_GATEWAY_METRICS")
    add_observability_flags(p)
    add_http_server_flags(p)
    flags.add(p, "--control", env="LAYA_GATEWAY_CONTROL", default=None, metavar="ADDRESS",
              help="a second gRPC address (unix:/path.sock) reaching this worker alone, also when several "
                   "share --grpc, to see its own readiness and status; 'serve' gives each gateway worker one "
                   "in its run dir and reports ready once every worker is")
    flags.add(p, "--reuse-port", env="LAYA_GATEWAY_REUSE_PORT", action="store_true",
              help="share the --http and --grpc ports with other gateway processes (SO_REUSEPORT; "
                   "the kernel spreads connections); 'serve --gateway-workers N' sets it")
    replicas = ("; several replicas: a comma list of HOST:PORT or unix:/path, or dns:///NAME:PORT (every address "
                "the name resolves to, re-resolved by gRPC); calls are spread by gRPC round_robin over the "
                "replicas that report SERVING and a call that fails UNAVAILABLE is retried once on another")
    flags.add(p, "--tokenizer", env="LAYA_TOKENIZER_ADDRESSES", append=True, default=["127.0.0.1:50053"],
              help="tokenizer service address" + replicas + ". ipc:///PATH?grpc=ADDRESS sends Tokenize calls over "
                   "that unix socket (same host, core/ipc.py) and keeps health on the gRPC ADDRESS")
    flags.add(p, "--inference", env="LAYA_INFERENCE_ADDRESS", default="127.0.0.1:50052",
              help="inference service address" + replicas + "; every replica must serve the same checkpoint set "
                   "(ipc:///PATH?grpc=ADDRESS as for --tokenizer)")
    flags.add(p, "--request-timeout-s", env="LAYA_REQUEST_TIMEOUT_S", default=DEFAULT_REQUEST_TIMEOUT_S, type=float,
              help="HTTP decision requests fail 408 after this many seconds; the backend calls get what is left "
                   "as their gRPC deadline (gRPC clients set their own deadline); 0 = no limit")
    draining.add_flag(p)
    flags.add(p, "--strict-model", env="LAYA_STRICT_MODEL", action="store_true",
              help="answer a request whose 'model' names no checkpoint served here with 404 (gRPC NOT_FOUND) "
                   "instead of routing it automatically as upstream laya serve does (the default; the "
                   "response then names the unknown model in the X-Laya-Unknown-Model header)")
    flags.add(p, "--checkpoint", env="LAYA_CHECKPOINTS", append=True, metavar="NAME=SOURCE",
              help="the checkpoints the inference service serves (names route requests; sources show in routing.repo)")
