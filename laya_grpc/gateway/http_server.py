"""The HTTP server under the app: uvicorn's httptools protocol plus connection hygiene.

uvicorn keeps a connection open for as long as the client likes until its request headers are
complete (a silent socket, a lone request line or headers at 2 bytes/s stay open for minutes),
and has no cap on open connections short of `limit_concurrency`, which also counts running
requests and answers them 503. Hypercorn's `read_timeout` restarts at every read and granian
serves from its own worker processes, outside this event loop. So the guard is a thin subclass
of uvicorn's protocol, which keeps upstream's exact HTTP behaviour (tests/test_http_contract.py):

- header timeout: a connection must deliver a request's complete headers within
  `--http-header-timeout-seconds` of opening (or of the request's first byte on a kept-alive
  connection), else it is closed without a response (the body has its own 408 deadline);
- idle timeout: a kept-alive connection with no new request is closed after `--http-idle-timeout-seconds`
  (uvicorn's keep-alive timeout); a client still sending the body of a request already answered
  is closed at once instead of being read;
- connection cap: past `--http-max-connections` open connections a new one sheds the oldest
  connection that holds no request (conn_limits.py); only when every open one is inside a
  request is the new one closed (admission then bounds the requests among those that stay).
"""
from __future__ import annotations

import asyncio
import contextlib
from typing import Optional

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from laya_grpc.core.runtime import metrics

from .conn_limits import IdleConnections
from .settings import DEFAULT_HEADER_TIMEOUT_S, DEFAULT_MAX_CONNECTIONS, GatewayOptions


class GuardedHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol with a header deadline and a connection cap that sheds the
    oldest connection holding no request."""
    header_timeout_s = DEFAULT_HEADER_TIMEOUT_S
    max_connections = DEFAULT_MAX_CONNECTIONS

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: Optional[asyncio.TimerHandle] = None

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._idle = IdleConnections.of(self.server_state)
        if len(self.connections) > self.max_connections and not self._idle.shed_oldest():
            metrics.REJECTED.labels("http", "connections").inc()
            transport.close()
            return
        self._idle.add(self)
        self._arm_header_timer()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm_header_timer()     # a kept-alive connection's next request: its own deadline

    def on_headers_complete(self) -> None:
        self._cancel_header_timer()
        self._idle.discard(self)     # inside a request: never shed
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        cycle = self.cycle
        if cycle is not None and cycle.more_body and not self.transport.is_closing():
            self.transport.close()   # still sending the body of an answered request: not read on
        elif not self.transport.is_closing():
            self._idle.add(self)     # kept alive, waiting for the next request

    def connection_lost(self, exc) -> None:
        self._cancel_header_timer()
        self._idle.discard(self)
        super().connection_lost(exc)

    def _arm_header_timer(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_too_slow)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing():
            metrics.REJECTED.labels("http", "header_timeout").inc()
            self.transport.close()


class GatewayHttpServer(uvicorn.Server):
    """uvicorn's server without its signal handlers: the gateway's shutdown (gateway/server.py) is
    the one owner of SIGTERM/SIGINT. uvicorn's `serve()` swaps in its own handlers with
    `signal.signal` (replacing the event loop's) and, on the signal, stops listening and cancels the
    requests still running after `timeout_graceful_shutdown`; here the gateway sets `should_exit`
    itself once it has begun draining, and the grace for open responses is `--drain-grace-seconds`."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield


def build_server(app, host: str, port: int, args: GatewayOptions, root_path: str = "") -> uvicorn.Server:
    """The uvicorn server for the gateway's HTTP front, with the limits of the settings; responses
    still open at shutdown get `args.drain_grace_s` to finish."""
    protocol = type("GatewayHttpProtocol", (GuardedHttpTools,), {
        "header_timeout_s": args.http_header_timeout, "max_connections": args.http_max_connections})
    # httptools: ~0.1 ms less gateway CPU a request than uvicorn's h11 default (docs/performance.md)
    server = GatewayHttpServer(uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                                           log_config=None,   # uvicorn's lines go through our handler (JSON too)
                                           lifespan="off", timeout_keep_alive=args.http_idle_timeout,
                                           root_path=root_path, http=protocol,
                                           timeout_graceful_shutdown=args.drain_grace_s,
                                           # every request from a fresh context: a request's receive()
                                           # resumes a paused socket (a body over 64 KiB), asyncio
                                           # re-registers its reader in that request's context, and the
                                           # next requests on the kept-alive connection inherited it, its
                                           # deadline included (all 408 once it passed; CPython #140947)
                                           reset_contextvars=True))
    return server
