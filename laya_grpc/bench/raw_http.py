"""A bare HTTP/1.1 POST over one kept-open socket, for timings that must not include a client
library (an HTTP client library measured +0.9 ms a request on its own, docs/performance.md).

One request text is built once and sent again and again; the response is read up to its
Content-Length. Used by the bench's first-request and per-stage timings and by the focused tools
in benchmarks/.
"""
from __future__ import annotations

import socket
import time
from typing import Iterable


def post_bytes(address: str, path: str, body: bytes, headers: Iterable[tuple[str, str]] = ()) -> bytes:
    """The whole request text: POST `path` with a JSON `body` and any extra `headers`."""
    host = address.replace("http://", "")
    extra = b"".join(b"%s: %s\r\n" % (k.encode(), v.encode()) for k, v in headers)
    return (b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n"
            % (path.encode(), host.encode(), extra, len(body))) + body


def connect(address: str) -> socket.socket:
    """A TCP connection to `host:port` (or `http://host:port`) with Nagle off."""
    host, _, port = address.replace("http://", "").rpartition(":")
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def exchange(sock: socket.socket, req: bytes) -> tuple[int, dict, bytes]:
    """Send `req`, read one response: (status, header fields with lower-case names, body)."""
    sock.sendall(req)
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed by the server")
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    fields = {a.strip().lower(): b.strip() for a, _, b in (x.partition(b":") for x in head.split(b"\r\n")[1:])}
    length = int(fields.get(b"content-length", b"0"))
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed by the server mid-body")
        rest += chunk
    return int(head.split(b" ", 2)[1]), fields, rest


class Connection:
    """One kept-open connection posting the same request: `post()` -> (status, fields, body, ms)."""

    def __init__(self, address: str, path: str, body: bytes, headers: Iterable[tuple[str, str]] = ()):
        self.req = post_bytes(address, path, body, headers)
        self.sock = connect(address)

    def post(self) -> tuple[int, dict, bytes, float]:
        t0 = time.perf_counter()
        status, fields, rest = exchange(self.sock, self.req)
        return status, fields, rest, (time.perf_counter() - t0) * 1e3

    def close(self) -> None:
        self.sock.close()
