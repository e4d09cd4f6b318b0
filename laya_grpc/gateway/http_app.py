"""The HTTP front end: upstream `laya serve` 0.4.15's three routes on Starlette.

Handlers stay tiny; everything that can go wrong is a LayaError turned into `{"detail": ...}`
with the kind's status by one handler. Per decision request, in upstream's order, through the
gateway's `Policy` (policy.py): bearer auth (401, before anything else, even when saturated) ->
an admission slot, waiting in the bounded queue (past it 503 + Retry-After: 1) -> capped,
time-limited body read (413/408) -> `laya_grpc.gateway.http_body` parsing -> the request's rows
from the admission budget -> the decider -> JSON rendering (a NaN there is upstream's 422).
Timing headers go on 200s of the decision routes only.

Starlette's router gives upstream's 404 `Not Found`, 405 `Method Not Allowed` + `Allow` and 307
trailing-slash redirect, through the same JSON error shape FastAPI installs. Upstream's FastAPI
docs routes (`/docs`, `/redoc`, `/openapi.json`, served only without a key) are not served: 404.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Awaitable, Callable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from laya_grpc.core.runtime import logs, metrics, timing
from . import request_scope
from laya_grpc.core.errors import RETRY_AFTER_HEADER, Kind, LayaError

from laya_grpc.engine import deadline
from laya_grpc.engine.decider import Decider

from .admission import read_body, rows_of
from .http_body import parse_batch_body, parse_decide_body
from .policy import Policy
from .render import render_json
from .settings import GatewaySettings

_log = logging.getLogger("laya_grpc.gateway")

INTERNAL_DETAIL = "inference failed"
UNKNOWN_MODEL_HEADER = "X-Laya-Unknown-Model"   # a `model` that names no checkpoint here (auto-routed)
CLIENT_GONE_DETAIL = "client closed the request"
CLIENT_CLOSED_REQUEST = 499   # nginx's code for it; never reaches the client
LIVENESS_ONLY = {"status": "ok"}
# Upstream's /health keys, in its order; `services.health()` must provide them.
UPSTREAM_HEALTH_KEYS = ("loaded", "revisions", "device", "device_is_preference", "checkpoint_devices",
                        "cpu_fallbacks")


def json_response(content: Any, status: int = 200, headers: dict | None = None) -> Response:
    return Response(render_json(content), status_code=status, headers=headers, media_type="application/json")


class ClientGone(Exception):
    """The client closed its connection before its answer was ready."""


async def until_disconnect(work: Awaitable, receive) -> Any:
    """`await work`, unless the client disconnects first: then the work is cancelled (its rows
    leave the gateway, tokenizer and inference queues) and ClientGone is raised. uvicorn never
    cancels a request on disconnect; it only answers `receive()` with `http.disconnect`.

    The work runs in the request's own task, and a watcher task cancels that task when the
    disconnect comes: a task of its own for the work would cost each request two more turns of
    the event loop, which under overload is what it waits for (HTTP then finished fewer requests
    than gRPC in the same slots)."""
    task = asyncio.current_task()
    state = {"running": True, "gone": False}

    async def disconnected() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        if state["running"]:
            state["gone"] = True
            task.cancel()

    watcher = asyncio.ensure_future(disconnected())
    try:
        return await work
    except asyncio.CancelledError:
        if not state["gone"]:
            raise
        uncancel = getattr(task, "uncancel", None)   # Python 3.11+: the request's task is not cancelled
        if uncancel is not None:
            uncancel()
        raise ClientGone() from None
    finally:
        state["running"] = False
        watcher.cancel()


def _client_gone() -> Response:
    """Nothing to answer (the server drops a response to a closed connection), nothing to log."""
    metrics.CANCELLED.labels("http").inc()
    return json_response({"detail": CLIENT_GONE_DETAIL}, CLIENT_CLOSED_REQUEST)


def error_response(error: LayaError) -> Response:
    """The one LayaError -> HTTP mapping: the kind's status, upstream's `{"detail"}`, Retry-After
    on BUSY, and `Connection: close` on a 401 (it is answered before the body is read, so the
    connection cannot carry another request)."""
    status = error.kind.http_status
    headers = None
    if error.kind is Kind.BUSY:
        headers = {"Retry-After": RETRY_AFTER_HEADER}
    elif error.kind is Kind.UNAUTHENTICATED:
        headers = {"Connection": "close"}
    # Upstream never shows a 500's cause to the client (paths, memory state): it goes to the log.
    detail = INTERNAL_DETAIL if status == 500 else error.detail
    if status == 500:
        _log.error("request failed: %s", logs.clip(repr(error)))
    return json_response({"detail": detail}, status, headers)


def _route_path(scope) -> str:
    """The path Starlette's router matches (starlette._utils.get_route_path: without root_path)."""
    path, root_path = scope["path"], scope.get("root_path", "")
    if not root_path or not path.startswith(root_path):
        return path
    if path == root_path:
        return ""
    return path[len(root_path):] if path[len(root_path)] == "/" else path


def build_app(decider: Decider, settings: GatewaySettings, policy: Policy, request_timeout_s: float | None = None):
    """`policy`: auth, admission (shared with the gRPC front) and readiness."""
    admission, readiness = policy.admission, policy.readiness

    def authorized(request: Request) -> bool:
        return policy.auth.allows(request.headers.get("authorization"))

    def decision_route(route: str, parse: Callable, run: Callable[[Any], Awaitable[dict]], rows: Callable):
        async def endpoint(request: Request) -> Response:
            headers = request.headers
            with request_scope.observed("http", route, headers.get("x-request-id"), headers.get("traceparent"),
                                        operation="%s %s" % (request.method, _route_path(request.scope))) as scope:
                try:
                    response = await answer(request)
                except LayaError as error:
                    scope.status = error.kind.http_status
                    response = error_response(error)
                scope.status = scope.status or response.status_code
                response.headers["x-request-id"] = scope.request_id
                return response

        async def answer(request: Request) -> Response:
            t = timing.start() if request.headers.get(timing.REQUEST_HEADER) == "1" else None
            policy.auth.check(request.headers.get("authorization"))
            peer = request.client
            # the deadline covers the wait in the admission queue too
            with deadline.within(request_timeout_s or None):
                async with admission.enter("http:" + (peer.host if peer else ""),
                                           "http:%s:%s" % (peer.host, peer.port) if peer else "") as ticket:
                    try:
                        raw = await read_body(request.stream(), request.headers.get("content-length"),
                                              settings.body_read_timeout)
                    except ClientDisconnect:
                        return _client_gone()
                    admission.trim.add(len(raw))
                    timing.mark("admission_body")
                    req = parse(raw, decider.route_table, settings.max_token_budget)
                    timing.mark("parse")
                    try:
                        n = rows(req)
                        if not ticket.charge_now(n):   # a large request waits for rows; its client may leave
                            await until_disconnect(ticket.charge(n), request.receive)
                        t0 = time.perf_counter()
                        result = await until_disconnect(run(req), request.receive)
                    except ClientGone:
                        return _client_gone()
                    except LayaError:
                        raise
                    except Exception as error:  # a bug or a lost service: never leak it to the client
                        _log.exception("inference failed")
                        raise LayaError(Kind.INTERNAL, INTERNAL_DETAIL) from error
                ms = "%.2f" % ((time.perf_counter() - t0) * 1000.0)
                resp = json_response(result.body(), headers={"Server-Timing": "inference;dur=" + ms,
                                                      "X-Inference-Time-Ms": ms})
                if req.controls.unknown_model is not None:   # auto-routed as upstream does; said here
                    resp.headers[UNKNOWN_MODEL_HEADER] = logs.header_value(req.controls.unknown_model)
                if t is not None:
                    t.mark("render")
                    resp.headers[timing.REQUEST_HEADER] = t.header()
                return resp
        return endpoint

    async def health(request: Request) -> Response:
        if not authorized(request):
            return json_response(LIVENESS_ONLY)
        facts = dict(decider.services.health())
        payload = {"status": "ok"}
        for key in UPSTREAM_HEALTH_KEYS:
            payload[key] = facts.pop(key)
        facts.pop("ready", None)
        payload["ready"] = readiness.ready()
        payload.update(facts)
        return json_response(payload)

    async def ready(request: Request) -> Response:
        """Readiness probe: 200 only while requests can be answered, else 503 with the reason
        (/health answers 200 with "ready": false during an outage, which a probe cannot use). With a
        key set the reason, which names backend addresses, is for callers holding the key only."""
        reason = readiness.reason()
        if reason:
            body = {"ready": False, "detail": reason} if authorized(request) else {"ready": False}
            return json_response(body, 503)
        return json_response({"ready": True})

    async def live(request: Request) -> Response:
        """Liveness probe: 200 while this process answers; a backend being down is no reason to restart it."""
        return json_response(LIVENESS_ONLY)

    async def laya_error(request: Request, error: LayaError) -> Response:
        return error_response(error)

    async def http_error(request: Request, error: HTTPException) -> Response:
        # FastAPI's shape for Starlette's own 404/405 (with its Allow header).
        return json_response({"detail": error.detail}, error.status_code, error.headers)

    decide_endpoint = decision_route("decide", parse_decide_body, decider.decide,
                                     lambda req: rows_of(1, len(req.questions)))
    batch_endpoint = decision_route("batch", parse_batch_body, decider.decide_batch,
                                    lambda req: rows_of(len(req.states), len(req.questions)))
    routes = [
        Route("/v1/systemone", decide_endpoint, methods=["POST"]),
        Route("/v1/systemone/batch", batch_endpoint, methods=["POST"]),
        Route("/health", health, methods=["GET"]),
        Route("/ready", ready, methods=["GET"]),
        Route("/live", live, methods=["GET"]),
    ]
    for route in routes:
        # Starlette implies HEAD for GET; FastAPI (upstream) does not, so HEAD /health is a 405.
        route.methods = set(m for m in route.methods if m != "HEAD")
    return Starlette(routes=routes, exception_handlers={LayaError: laya_error, HTTPException: http_error})
