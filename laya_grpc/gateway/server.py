"""`laya-grpc gateway`: HTTP `/v1/systemone` (upstream's contract) and the gRPC decision and
status APIs, in one asyncio process in front of the tokenizer and inference services.
Never imports torch or mlx. This file is the start-up and shutdown; the flags are in options.py,
the readiness loop in readiness.py, the warm-up in warmup.py, the HTTP socket in listen.py.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from laya_grpc.core import draining, metrics, rpc
from laya_grpc.core.errors import Kind, LayaError
from laya_grpc.core.lifecycle import ChangeFeed, install_stop_signals, setup_observability
from laya_grpc.core.restart_counts import seed_backend_restarts
from laya_grpc.core.routing import RouteTable
from laya_grpc.core.sources import parse_checkpoint_specs
from laya_proto.v1 import decision_pb2_grpc
from laya_grpc.engine.decider import Decider
from laya_grpc.engine.endpoints import parse_target, split_entries
from laya_grpc.engine.remote import RemoteServices

from .admission import Admission
from .grpc_api import DecisionServicer, StatusServicer
from .grpc_guards import public_server
from .http_app import build_app
from .http_server import build_server
from .listen import listen_socket, split_host_port
from .options import add_arguments, add_gateway_flags  # noqa: F401 - the command's flags (cli/main.py)
from .readiness import DECISION_SERVICE, STATUS_SERVICE, follow_readiness
from .settings import GatewaySettings

log = logging.getLogger("gateway")


async def serve(args: argparse.Namespace) -> int:
    settings = GatewaySettings.from_env()
    metrics.serve_metrics(args.metrics)
    sources = parse_checkpoint_specs(args.checkpoint)
    table = RouteTable.build(sources, settings.default_model)
    feed = ChangeFeed()
    services = RemoteServices(parse_target(args.tokenizer, "--tokenizer"), parse_target(args.inference, "--inference"),
                              feed)
    seed_backend_restarts(services.tokenizers, services.inferences)   # counts kept by the supervisor
    decider = Decider(services, table, settings)

    admission = Admission(settings.max_concurrent)   # one limit for HTTP and gRPC
    grpc_server = public_server(settings.api_key, admission, reuse_port=args.reuse_port)
    status = StatusServicer(services, feed, args.grpc)
    decision_pb2_grpc.add_DecisionServiceServicer_to_server(
        DecisionServicer(decider, settings.api_key, settings.max_token_budget, admission), grpc_server)
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
    app = build_app(decider, settings, args.request_timeout_s, admission)
    http = build_server(app, host, port, args, settings.root_path)
    services.start()

    readiness = asyncio.ensure_future(follow_readiness(services, feed, app, settings.api_key, hs))
    http_task = asyncio.ensure_future(http.serve(sockets=[listen_socket(host, port, args.reuse_port)]))
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
    # draining: not ready at once (health, /ready), then the requests in flight finish
    services.draining = True
    feed.bump()
    readiness.cancel()
    await rpc.set_health(hs, [DECISION_SERVICE, STATUS_SERVICE], False)
    if rc == 0:
        await draining.wait_idle(args.drain_grace_s, lambda: decider.inflight, "gateway")
    http.should_exit = True   # uvicorn closes idle connections and lets open responses finish
    await grpc_server.stop(grace=0.5)
    if not http_task.done():
        await http_task
    await services.close()
    return rc


def run(args: argparse.Namespace) -> int:
    setup_observability("gateway", args)
    try:
        return asyncio.run(serve(args))
    except LayaError as e:
        print("laya-grpc gateway: %s" % e.detail, file=sys.stderr)
        return 2
