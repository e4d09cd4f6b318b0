"""Connection limits of the gateway's two public ports, and what happens when descriptors run out.

- gRPC (`grpc_server_options`, the one place the public server's transport limits are set): at
  most `--grpc-max-connections` connections (one more is closed at once by gRPC itself); a
  connection must finish its HTTP/2 handshake within `HANDSHAKE_TIMEOUT_S` (a silent TCP
  connection holds a descriptor for that long, no longer); one without calls for `MAX_IDLE_S` is
  sent GOAWAY; keep-alive pings find dead peers; at most `MAX_STREAMS` concurrent streams per
  connection. Pings are answered and never end a connection (core/wire/rpc.py: a strike limit ended our
  own clients' channels with "too_many_pings"); each costs one small frame.
- HTTP (`IdleConnections`, used by http_server.GuardedHttpTools): past `--http-max-connections`,
  a new connection sheds the oldest one that holds no request (silent since it opened, or kept
  alive between requests) instead of being refused; only when every open connection is inside a
  request is the new one closed. A flood of silent connections then cannot lock clients out.
- Descriptors (`fit_descriptors`): the soft RLIMIT_NOFILE is raised to the hard limit at start,
  and both caps are lowered to fit it with room for the backend channels, so the caps bind before
  the process runs out of descriptors.
- Memory: what a flood of connections allocated is freed when they close, but glibc keeps it;
  the heap is trimmed once RSS grew by 16 MiB since the last trim (core/runtime/memory.py GrowthTrim).
- Should the HTTP accept loop run out anyway, asyncio stops accepting for a second and retries;
  its log line ("socket.accept() out of system resource", once per pending connection, up to
  2,048 a second) is folded by `quiet_accept_errors` into one warning a minute with a count.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import logging
import resource
import time
import weakref
from typing import Optional

from laya_grpc.core.runtime import memory, metrics

log = logging.getLogger("laya_grpc.gateway.conn_limits")

DEFAULT_GRPC_MAX_CONNECTIONS = 4096
HANDSHAKE_TIMEOUT_S = 10.0       # as the HTTP header timeout's default
MAX_IDLE_S = 300.0               # a connection with no call for this long gets GOAWAY (clients reconnect)
MAX_STREAMS = 1024               # concurrent streams per connection (admission bounds the work itself)
RESERVED_DESCRIPTORS = 256       # backend channels, sockets of the metrics and control endpoints, files
ACCEPT_LOG_EVERY_S = 60.0


def grpc_server_options(max_connections: int) -> list:
    """The public gRPC server's connection and HTTP/2 limits (grpc channel arguments)."""
    return [
        ("grpc.max_allowed_incoming_connections", int(max_connections)),
        ("grpc.server_handshake_timeout_ms", int(HANDSHAKE_TIMEOUT_S * 1e3)),
        ("grpc.max_connection_idle_ms", int(MAX_IDLE_S * 1e3)),
        ("grpc.max_concurrent_streams", MAX_STREAMS),
    ]


def fit_descriptors(http_max: int, grpc_max: int) -> tuple[int, int]:
    """Raise the soft descriptor limit to the hard one, then (http_max, grpc_max) lowered in
    proportion where both caps plus RESERVED_DESCRIPTORS would not fit it (said once)."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY or hard > soft:
            target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
                soft = target
            except (ValueError, OSError):
                pass
    except (ValueError, OSError):
        return http_max, grpc_max
    room = soft - RESERVED_DESCRIPTORS
    if soft == resource.RLIM_INFINITY or http_max + grpc_max <= room:
        return http_max, grpc_max
    room = max(2, room)
    h = max(1, room * http_max // (http_max + grpc_max))
    g = max(1, room - h)
    log.warning("the descriptor limit (%d) cannot hold --http-max-connections %d and --grpc-max-connections %d: "
                "capped at %d and %d (raise `ulimit -n` to keep them)", soft, http_max, grpc_max, h, g)
    return h, g


class IdleConnections:
    """The HTTP connections that hold no request, oldest first; one per server."""

    _of_state: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()

    def __init__(self) -> None:
        self._order: "collections.OrderedDict" = collections.OrderedDict()

    @classmethod
    def of(cls, server_state) -> "IdleConnections":
        idle = cls._of_state.get(server_state)
        if idle is None:
            idle = cls._of_state[server_state] = IdleConnections()
        return idle

    def add(self, conn) -> None:
        """`conn` waits for a request (just opened, or kept alive after a response)."""
        self._order[conn] = None
        self._order.move_to_end(conn)

    def discard(self, conn) -> None:
        self._order.pop(conn, None)

    def shed_oldest(self) -> bool:
        """Close the connection that has waited longest without a request; False if none waits."""
        while self._order:
            conn, _ = self._order.popitem(last=False)
            transport = getattr(conn, "transport", None)
            if transport is not None and not transport.is_closing():
                transport.close()
                metrics.REJECTED.labels("http", "shed_idle").inc()
                return True
        return False


_running: list = []
_accept_state = {"count": 0, "since": 0.0, "logged": -1e18}


def quiet_accept_errors(loop: asyncio.AbstractEventLoop) -> None:
    """Fold asyncio's per-attempt "out of system resource" accept errors into one warning a
    minute; every other exception context goes to the handler in place before."""
    previous = loop.get_exception_handler()

    def handler(lp, context):
        if context.get("message") == "socket.accept() out of system resource":
            now = time.monotonic()
            if not _accept_state["count"]:
                _accept_state["since"] = now
            _accept_state["count"] += 1
            if now - _accept_state["logged"] >= ACCEPT_LOG_EVERY_S:
                log.warning("HTTP accept paused: out of descriptors (%s); %d refused accepts in %.0f s, asyncio "
                            "retries every second (next report in %.0f s at most)", context.get("exception"),
                            _accept_state["count"], now - _accept_state["since"], ACCEPT_LOG_EVERY_S)
                _accept_state.update(count=0, logged=now)
            metrics.REJECTED.labels("http", "descriptors").inc()
            return
        if previous is not None:
            previous(lp, context)
        else:
            lp.default_exception_handler(context)

    loop.set_exception_handler(handler)


def setup(args: argparse.Namespace, loop: Optional[asyncio.AbstractEventLoop] = None) -> list:
    """At gateway start: both caps fitted to the descriptor limit (the HTTP one written back to
    `args`, where the HTTP server reads it), the accept-error log folded; returns the public gRPC
    server's options."""
    loop = loop or asyncio.get_running_loop()
    args.http_max_connections, grpc_max = fit_descriptors(args.http_max_connections, args.grpc_max_connections)
    quiet_accept_errors(loop)
    # connections' memory is freed when they close but kept by the allocator: trim on growth
    trim = memory.GrowthTrim(lambda fn: loop.run_in_executor(None, fn), counter=metrics.GATEWAY_HEAP_TRIMS)
    trim.start()
    _running.append(trim)   # held for the process's life (asyncio keeps only weak task references)
    return grpc_server_options(grpc_max)
