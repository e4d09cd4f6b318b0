"""`laya-grpc gateway`: HTTP `/v1/systemone` (upstream's contract) and the gRPC decision and
status APIs, in one asyncio process in front of the tokenizer and inference services, which it
finds at --tokenizer and --inference. It reports ready (gRPC health, /ready) once both are serving
and its own warm-up request has gone through; it never imports torch or mlx.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time

from laya_grpc.core.runtime import draining, flags, metrics
from laya_grpc.core.wire import rpc
from laya_grpc.core.errors import Kind, LayaError
from laya_grpc.core.runtime.lifecycle import ChangeFeed, install_stop_signals, setup_observability
from laya_grpc.core.runtime.restart_counts import seed_backend_restarts
from laya_grpc.core.decisions.routing import RouteTable
from laya_proto.v1 import decision_pb2_grpc
from laya_grpc.engine.decider import Decider
from laya_grpc.engine.endpoints import parse_target, split_entries
from laya_grpc.engine.remote_services import RemoteServices

from . import conn_limits
from .admission import Admission
from .policy import Auth, Policy
from .grpc_api import DecisionServicer, StatusServicer
from .grpc_guards import public_server
from .http_app import build_app
from .http_server import build_server
from .listen import listen_socket, split_host_port
from .readiness import DECISION_SERVICE, STATUS_SERVICE, Readiness, follow_readiness
from .settings import GatewaySettings

log = logging.getLogger("gateway")

# after the last decision request of a drain: time for its reply to be written before the gRPC
# server ends the streams still open (Watch)
STREAMS_GRACE_S = 1.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    flags.add_settings(p, GatewaySettings)


async def serve(args: argparse.Namespace) -> int:
    settings: GatewaySettings = args.settings
    metrics.serve_metrics(args.metrics)
    sources = settings.checkpoint_sources()
    table = RouteTable.build(sources, settings.default_model, strict_model=settings.strict_model)
    feed = ChangeFeed()
    services = RemoteServices(parse_target(args.tokenizer, "--tokenizer"), parse_target(args.inference, "--inference"),
                              feed)
    seed_backend_restarts(services.watch.tokenizers, services.watch.inferences)   # counts kept by the supervisor
    decider = Decider(services, table, settings)

    # one policy for both fronts: auth, admission (one queue and budget for HTTP and gRPC), readiness
    policy = Policy(Auth(settings.api_key), Admission(settings.admission), Readiness(services.watch))
    grpc_server = public_server(policy, reuse_port=args.reuse_port, options=conn_limits.setup(args))
    status = StatusServicer(services.watch, policy.readiness, feed, args.grpc)
    decision_pb2_grpc.add_DecisionServiceServicer_to_server(
        DecisionServicer(decider, policy, settings.max_token_budget), grpc_server)
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
    # the HTTP socket before the gRPC server starts: a port in use ends here with one message, not
    # with a running gRPC server that the closed event loop cannot shut down
    host, port = split_host_port(args.http, "--http")
    http_socket = listen_socket(host, port, args.reuse_port)
    await grpc_server.start()

    app = build_app(decider, settings, policy, args.request_timeout_s)
    http = build_server(app, host, port, args, settings.root_path)
    services.start()

    readiness = asyncio.ensure_future(follow_readiness(policy.readiness, feed, app, settings.api_key, hs))
    http_task = asyncio.ensure_future(http.serve(sockets=[http_socket]))
    log.info("gateway: http on %s:%d, grpc on %s%s, tokenizer %s, inference %s", host, port, status.address,
             " (this worker: %s)" % control if control else "", ",".join(split_entries(args.tokenizer)),
             ",".join(split_entries(args.inference)))
    stop = asyncio.Event()
    install_stop_signals(stop)
    done, _ = await asyncio.wait([asyncio.ensure_future(stop.wait()), http_task], return_when=asyncio.FIRST_COMPLETED)
    if http_task in done and not stop.is_set():
        exc = http_task.exception()
        log.error("HTTP server stopped: %s", exc or "could not listen on --http %s (address in use?)" % args.http)
        rc = 2
    else:
        rc = 0
    await drain(http, http_task, grpc_server, hs, policy, feed, readiness, args.drain_grace_s if rc == 0 else 0.0)
    await services.close()
    return rc


async def drain(http, http_task, grpc_server, hs, policy, feed: ChangeFeed, readiness, grace_s: float) -> None:
    """The gateway's one shutdown path (SIGTERM, SIGINT, or the HTTP server failing): not ready at
    once (/ready 503, grpc.health.v1 NOT_SERVING, the ready gauge 0); both listeners stop accepting
    connections; requests already running on either transport finish within `grace_s`; then the
    process exits. Idle kept-alive HTTP connections are closed, busy ones answer with
    `Connection: close`; gRPC sends GOAWAY. The backends stay up meanwhile (under `serve` they are
    stopped only after every gateway has exited, cli/supervisor.py).

    Streams that never end by themselves (grpc.health.v1 and StatusService `Watch`) do not hold the
    exit: once no decision request holds an admission slot or waits for one, the gRPC server gets
    STREAMS_GRACE_S more, then ends what is left (the watchers have seen NOT_SERVING by then)."""
    t0 = time.monotonic()
    state: Readiness = policy.readiness
    state.draining = True
    feed.bump()
    readiness.cancel()
    metrics.GATEWAY_READY.set(0)
    await rpc.set_health(hs, [DECISION_SERVICE, STATUS_SERVICE], False)
    http.should_exit = True   # uvicorn: listener closed, open responses get the drain grace
    grpc_stopped = asyncio.ensure_future(grpc_server.stop(grace=grace_s))
    admission = policy.admission
    await draining.wait_idle(grace_s, lambda: admission.taken + admission.waiting, "gateway requests")
    # the most restrictive grace of the calls applies (grpc.aio.Server.stop)
    await grpc_server.stop(grace=min(STREAMS_GRACE_S, max(0.0, t0 + grace_s - time.monotonic())))
    await asyncio.gather(grpc_stopped, http_task, return_exceptions=True)
    await draining.settle_calls()
    log.info("gateway drained in %.2f s", time.monotonic() - t0)


def run(args: argparse.Namespace) -> int:
    setup_observability("gateway", args.settings)
    try:
        return asyncio.run(serve(args))
    except LayaError as e:
        print("laya-grpc gateway: %s" % e.detail, file=sys.stderr)
        return 2
