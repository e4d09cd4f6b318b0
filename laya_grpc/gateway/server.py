"""`laya-grpc gateway`: HTTP `/v1/systemone` (upstream's contract) and the gRPC decision and
status APIs, in one asyncio process in front of the tokenizer and inference services.
Never imports torch or mlx.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import socket
import sys
import time

import uvicorn

from laya_grpc.core import flags, metrics, rpc
from laya_grpc.core.errors import Kind, LayaError
from laya_grpc.core.lifecycle import ChangeFeed, install_stop_signals, setup_logging
from laya_grpc.core.routing import RouteTable
from laya_grpc.core.sources import parse_checkpoint_specs
from laya_proto.v1 import decision_pb2, decision_pb2_grpc

from .decider import Decider
from .grpc_api import DecisionServicer, StatusServicer
from .http_app import build_app
from .remote import RemoteServices
from .settings import GatewaySettings

log = logging.getLogger("gateway")
DECISION_SERVICE = decision_pb2.DESCRIPTOR.services_by_name["DecisionService"].full_name
STATUS_SERVICE = decision_pb2.DESCRIPTOR.services_by_name["StatusService"].full_name


WARMUP_QUESTIONS = {"c": {"type": "choice", "instructions": "warm-up", "criteria": ["a", "b", "c"]},
                    "s": {"type": "score", "instructions": "warm-up", "criteria": ["low", "high"]},
                    "n": {"type": "noul", "instructions": "warm-up"}}


async def warm_up(app, checkpoints: list, api_key, n_tokenizers: int = 1) -> str:
    """Requests through the HTTP app itself (auth, body, parse, routing, tokenizer, inference,
    decode, render): one per warm checkpoint plus one auto-routed, each sent once to every tokenizer
    worker (requests go round-robin over them, so n consecutive ones reach all n). Failures are
    logged, not fatal. Returns what was done, for the status stream."""
    t0 = time.perf_counter()
    headers = [(b"content-type", b"application/json")]
    if api_key:
        headers.append((b"authorization", b"Bearer " + api_key.encode()))
    bodies = [{"model": name} for name in checkpoints] + [{}]
    n_tok = max(1, n_tokenizers)
    n_http = n_ok = 0
    for extra in bodies:
        body = json.dumps(dict({"state": "A short warm-up text for the gateway.", "questions": WARMUP_QUESTIONS},
                               **extra)).encode()
        for _ in range(n_tok):
            status = await _asgi_post(app, "/v1/systemone", body, headers)
            n_http += 1
            n_ok += status == 200
            if status != 200:
                log.warning("warm-up request %s answered %d", extra or "(auto-routed)", status)
    detail = "warm-up: %d/%d requests answered, through %d tokenizers, checkpoints %s + auto-routed, %.0f ms" % (
        n_ok, n_http, n_tok, ",".join(checkpoints) or "-", (time.perf_counter() - t0) * 1e3)
    log.info("gateway %s", detail)
    return detail


async def _asgi_post(app, path: str, body: bytes, headers: list) -> int:
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": headers + [(b"content-length", str(len(body)).encode())],
             "client": ("127.0.0.1", 0), "server": ("127.0.0.1", 0)}
    sent = {"status": 0}
    chunks = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive():
        return chunks.pop(0) if chunks else {"type": "http.disconnect"}

    async def send(message):
        if message["type"] == "http.response.start":
            sent["status"] = message["status"]
    await app(scope, receive, send)
    return sent["status"]


def listen_socket(host: str, port: int, reuse_port: bool) -> socket.socket:
    """The HTTP listening socket; with reuse_port several gateway processes accept on one port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto must be IPPROTO_TCP: asyncio sets TCP_NODELAY on accepted sockets only then (else Nagle
    # and delayed ACKs add ~40 ms to every response)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise LayaError(Kind.INVALID, "cannot listen on --http %s:%d: %s" % (host, port, e)) from None
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def split_host_port(text: str, what: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise LayaError(Kind.INVALID, "%s expects HOST:PORT, got %r" % (what, text))
    return host.strip("[]") or "127.0.0.1", int(port)


async def serve(args: argparse.Namespace) -> int:
    settings = GatewaySettings.from_env()
    metrics.serve_metrics(args.metrics)
    sources = parse_checkpoint_specs(args.checkpoint)
    table = RouteTable.build(sources, settings.default_model)
    feed = ChangeFeed()
    services = RemoteServices(args.tokenizer, args.inference, feed)
    decider = Decider(services, table, settings)

    grpc_server = rpc.server(reuse_port=args.reuse_port)
    status = StatusServicer(services, feed, args.grpc)
    decision_pb2_grpc.add_DecisionServiceServicer_to_server(
        DecisionServicer(decider, settings.api_key, settings.max_token_budget), grpc_server)
    decision_pb2_grpc.add_StatusServiceServicer_to_server(status, grpc_server)
    hs = rpc.add_health_and_reflection(grpc_server, [DECISION_SERVICE, STATUS_SERVICE])
    await rpc.set_health(hs, [DECISION_SERVICE, STATUS_SERVICE], False)
    try:
        status.address = rpc.bind(grpc_server, args.grpc)
    except RuntimeError as e:
        raise LayaError(Kind.INVALID, "cannot listen on --grpc %s: %s (address in use?)" % (args.grpc, e)) from None
    control = None
    if args.control:   # this worker alone, also when several share --grpc (serve watches each one's readiness)
        try:
            control = rpc.bind(grpc_server, args.control)
        except RuntimeError as e:
            raise LayaError(Kind.INVALID, "cannot listen on --control %s: %s" % (args.control, e)) from None
    await grpc_server.start()

    host, port = split_host_port(args.http, "--http")
    app = build_app(decider, settings)
    # httptools: ~0.1 ms less gateway CPU a request than uvicorn's h11 default (docs/performance.md)
    http = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                                         lifespan="off", timeout_keep_alive=30, root_path=settings.root_path,
                                         http="httptools"))
    http.install_signal_handlers = lambda: None  # we own SIGTERM/SIGINT
    services.start()

    async def follow_readiness():
        """grpc.health.v1 on the gateway flips with real readiness of everything behind it.
        Each time the backends become ready, one request per warm checkpoint goes through the
        whole path first, so the first client request after ready is not the one that pays."""
        seen, serving = -1, None
        while True:
            await feed.wait(seen, 5.0)
            seen = feed.sequence
            if services.backends_ready() and not services.warm:
                services.warm_detail = await warm_up(app, services.ready_checkpoints(), settings.api_key,
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

    readiness = asyncio.ensure_future(follow_readiness())
    http_task = asyncio.ensure_future(http.serve(sockets=[listen_socket(host, port, args.reuse_port)]))
    log.info("gateway: http on %s:%d, grpc on %s%s, tokenizer %s, inference %s", host, port, status.address,
             " (this worker: %s)" % control if control else "", ",".join(args.tokenizer), args.inference)
    stop = asyncio.Event()
    install_stop_signals(stop)
    done, _ = await asyncio.wait([asyncio.ensure_future(stop.wait()), http_task], return_when=asyncio.FIRST_COMPLETED)
    if http_task in done and not stop.is_set():
        exc = http_task.exception()
        log.error("HTTP server stopped: %s", exc or "could not listen on --http %s (address in use?)" % args.http)
        rc = 2
    else:
        rc = 0
    await rpc.set_health(hs, [DECISION_SERVICE, STATUS_SERVICE], False)
    http.should_exit = True
    readiness.cancel()
    await grpc_server.stop(grace=2.0)
    if not http_task.done():
        await http_task
    await services.close()
    return rc


def add_gateway_flags(p: argparse.ArgumentParser) -> None:
    flags.add(p, "--http", env="LAYA_HTTP", default="127.0.0.1:8000",
              help="HOST:PORT for HTTP /v1/systemone, /v1/systemone/batch and /health")
    flags.add(p, "--grpc", env="LAYA_GRPC", default="127.0.0.1:50051",
              help="HOST:PORT (or unix:/path) for the gRPC DecisionService, StatusService and grpc.health.v1")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_gateway_flags(p)
    metrics.add_flag(p, "LAYA_GATEWAY_METRICS")
    flags.add(p, "--control", env="LAYA_GATEWAY_CONTROL", default=None, metavar="ADDRESS",
              help="a second gRPC address (unix:/path.sock) reaching this worker alone, also when several "
                   "share --grpc, to see its own readiness and status; 'serve' gives each gateway worker one "
                   "in its run dir and reports ready once every worker is")
    flags.add(p, "--reuse-port", env="LAYA_GATEWAY_REUSE_PORT", action="store_true",
              help="share the --http and --grpc ports with other gateway processes (SO_REUSEPORT; "
                   "the kernel spreads connections); 'serve --gateway-workers N' sets it")
    flags.add(p, "--tokenizer", env="LAYA_TOKENIZER_ADDRESSES", append=True, default=["127.0.0.1:50053"],
              help="tokenizer service address(es); requests are spread round-robin")
    flags.add(p, "--inference", env="LAYA_INFERENCE_ADDRESS", default="127.0.0.1:50052",
              help="inference service address")
    flags.add(p, "--checkpoint", env="LAYA_CHECKPOINTS", append=True, metavar="NAME=SOURCE",
              help="the checkpoints the inference service serves (names route requests; sources show in routing.repo)")


def run(args: argparse.Namespace) -> int:
    setup_logging("gateway")
    try:
        return asyncio.run(serve(args))
    except LayaError as e:
        print("laya-grpc gateway: %s" % e.detail, file=sys.stderr)
        return 2
