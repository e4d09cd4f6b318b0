"""The gateway's HTTP listening socket and HOST:PORT parsing."""
from __future__ import annotations

import socket

from laya_grpc.core.errors import Kind, LayaError


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
