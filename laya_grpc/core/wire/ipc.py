"""Tokenize and Infer calls between processes of one host over unix stream sockets (asyncio).

Why: the gateway makes two internal calls per request, and on one host the transport's cost is
its thread wake-ups. A message on an open grpc.aio stream pays HTTP/2 framing and grpc's
completion-queue threads; a ZeroMQ message (pyzmq) passes through
libzmq's I/O thread on each side, so every message wakes three threads (sender's I/O thread,
receiver's I/O thread, receiver). Here the event loop writes a frame to the socket and the peer's
event loop reads it: one wake-up per message. On the H200 host, inside the served stack, one
ZeroMQ leg took 150-210 us (p50) and a bare ZeroMQ echo round trip 0.09-0.11 ms against 0.036 ms
over a unix socket (benchmarks/results/2026-12-04-d150112/request-trace.txt; docs/performance.md
"Local transports").

Framing: each message is a 4-byte little-endian length and one serialized contract message,
`TokenizeCall`/`InferCall` one way and `TokenizeReply`/`InferReply` back, matched by id by the
same multiplexer as every internal call (`calls.CallMux` over `IpcTransport`; `calls.CallTable`
serves them), cancellation included. A frame longer than the internal message limit closes the
connection (the peer is not one of ours); a reply that would be longer is answered TOO_LARGE by
`calls.reply_to` before it is sent.

Addresses. A backend reached over IPC is named `ipc:///path/x.ipc?grpc=<its gRPC address>`:
calls go over the unix socket at /path/x.ipc, while health (grpc.health.v1 Watch), WatchStatus
and LoadCheckpoint stay on the service's gRPC address, which every service keeps. Any other
address is gRPC as before (remote endpoints and the public API never use IPC).

Peer death. The kernel closes a dead process's sockets, so every call in flight on the connection
fails at once with BUSY, as a broken gRPC stream does, and the next call connects again (a
restarted child is reached by the first call after its restart). A call made while nothing
listens fails with BUSY after retrying the connection for up to CONNECT_WAIT_S. A server whose
client went away cancels that client's calls. A backend that is alive but stuck is caught by each
call's own timeout.
"""
from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket
import struct
import time
from dataclasses import dataclass
from typing import Awaitable, Callable, Optional
from urllib.parse import parse_qs

from ..errors import Kind, LayaError
from .rpc import MAX_MESSAGE_BYTES
from .calls import CallMux, CallTable

log = logging.getLogger("laya_grpc.core.wire.ipc")
SCHEME = "ipc://"
CONNECT_WAIT_S = 1.0    # a call made while nothing listens retries the connection this long
_RETRY_S = 0.01         # between two connection attempts
_HEADER = struct.Struct("<I")


@dataclass(frozen=True)
class Link:
    """Where one backend's calls go (`ipc`, None for gRPC) and where its gRPC services are."""
    grpc: str
    ipc: Optional[str] = None

    @classmethod
    def parse(cls, address: str) -> "Link":
        if not address.startswith(SCHEME):
            return cls(address)
        endpoint, _, query = address.partition("?")
        grpc_address = parse_qs(query).get("grpc", [""])[0]
        if not grpc_address or endpoint == SCHEME:
            raise LayaError(Kind.INVALID, "IPC address %r must be ipc:///path?grpc=ADDRESS (the service's gRPC "
                            "address, for health and status)" % address)
        return cls(grpc_address, endpoint)


def address(ipc_endpoint: str, grpc_address: str) -> str:
    return "%s?grpc=%s" % (ipc_endpoint, grpc_address)


def _path(endpoint: str) -> str:
    """The unix socket path of an ipc:///path endpoint."""
    if not endpoint.startswith(SCHEME) or len(endpoint) <= len(SCHEME):
        raise LayaError(Kind.INVALID, "IPC endpoint %r must be ipc:///path" % endpoint)
    return endpoint[len(SCHEME):]


class _Frames(asyncio.Protocol):
    """Length-prefixed frames in, `on_frame(memoryview)` per frame; a frame over the message limit
    closes the connection. The view is valid only during the call (the buffer is then reused)."""

    def __init__(self, on_frame: Callable[[memoryview], None], on_lost: Callable[[], None], what: str):
        self._on_frame, self._on_lost, self._what = on_frame, on_lost, what
        self._buf = bytearray()
        self.transport: Optional[asyncio.Transport] = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        at, end = 0, len(buf)
        with memoryview(buf) as view:
            while end - at >= 4:
                n = _HEADER.unpack_from(buf, at)[0]
                if n > MAX_MESSAGE_BYTES:
                    log.warning("%s: a %d-byte frame is over the message limit; closing the connection", self._what, n)
                    self.transport.close()
                    break
                if end - at - 4 < n:
                    break
                frame = view[at + 4: at + 4 + n]
                try:
                    self._on_frame(frame)
                finally:
                    frame.release()
                at += 4 + n
        del buf[:at]

    def send(self, payload: bytes) -> bool:
        t = self.transport
        if t is None or t.is_closing():
            return False
        t.write(_HEADER.pack(len(payload)) + payload)
        return True

    def connection_lost(self, exc) -> None:
        self.transport = None
        self._on_lost()


# ------------------------------------------------------------------------------------ server side

class IpcServer:
    """A unix socket listening at the endpoint's path: every call runs as its own task (so calls
    batch together exactly as concurrent gRPC calls do) and its reply goes back on the caller's
    connection. The socket is bound in the constructor (a path in use is an error there) and
    served from `start()`, which needs a running event loop."""

    def __init__(self, endpoint: str, handle: Callable[[object], Awaitable], call_cls, reply_cls, error_cls,
                 name: str):
        self.endpoint, self.path = endpoint, _path(endpoint)
        self._handle, self._call_cls, self._reply_cls, self._error_cls = handle, call_cls, reply_cls, error_cls
        self.name = name
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            _unlink_stale(self.path)
            self._sock.bind(self.path)
            self._sock.listen(128)
        except OSError as e:
            self._sock.close()
            raise LayaError(Kind.INVALID, "cannot listen on %s: %s" % (endpoint, e.strerror or e)) from None
        self._sock.setblocking(False)
        self._conns: dict = {}   # open connection -> its calls (closed with the server)
        self._server: Optional[asyncio.AbstractServer] = None
        self._starting: Optional[asyncio.Task] = None

    def start(self) -> "IpcServer":
        """Serve from now on (the socket already queues connections made before this)."""
        loop = asyncio.get_running_loop()

        async def serve() -> None:
            self._server = await loop.create_unix_server(self._connection, sock=self._sock)

        self._starting = loop.create_task(serve())
        return self

    def _connection(self) -> _Frames:
        def on_frame(frame: memoryview) -> None:
            try:
                call = self._call_cls.FromString(frame)
            except Exception:  # noqa: BLE001 - undecodable bytes: nothing to answer to (no id)
                log.warning("%s: dropped an undecodable message on %s", self.name, self.endpoint)
                return
            table.receive(call)

        def on_lost() -> None:   # the caller went away: its calls' work is not wanted any more
            self._conns.pop(proto, None)
            table.cancel()

        async def send(reply) -> None:
            proto.send(reply.SerializeToString())

        proto = _Frames(on_frame, on_lost, self.name)
        table = CallTable(self._handle, send, self._reply_cls, self._error_cls, self.name)
        self._conns[proto] = table
        return proto

    async def close(self) -> None:
        for table in list(self._conns.values()):
            table.cancel()
        if self._starting is not None:
            try:
                await self._starting
            except (asyncio.CancelledError, OSError):
                pass
        if self._server is not None:
            self._server.close()
        else:
            self._sock.close()
        for proto in list(self._conns):
            if proto.transport is not None:
                proto.transport.close()
        _unlink_stale(self.path)


def _unlink_stale(path: str) -> None:
    """Remove a socket file nobody serves (a previous run's); a live one is left, so bind fails."""
    if not os.path.exists(path):
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError as e:
        if e.errno in (errno.ECONNREFUSED, errno.ENOENT):
            try:
                os.unlink(path)
            except OSError:
                pass
    finally:
        probe.close()


# ------------------------------------------------------------------------------------ client side

class IpcTransport:
    """Calls to an `ipc:///path` endpoint for `calls.CallMux`: a call made while nothing listens
    retries the connection for up to CONNECT_WAIT_S, then fails BUSY; a dropped connection (the
    backend exited or was killed) fails the calls in flight on it with BUSY."""

    def __init__(self, endpoint: str, reply_cls, what: str):
        self.endpoint, self.path = endpoint, _path(endpoint)
        self._reply_cls, self.what = reply_cls, what

    async def open(self, mux, timeout: Optional[float]) -> "_IpcLink":
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + (min(CONNECT_WAIT_S, timeout) if timeout else CONNECT_WAIT_S)
        link = _IpcLink(mux, self._reply_cls, self.what)
        while True:
            try:
                _, link.proto = await loop.create_unix_connection(
                    lambda: _Frames(link.on_frame, link.on_lost, self.what), self.path)
                return link
            except OSError:
                pass
            if time.monotonic() >= deadline:
                # the socket path stays in this log: a client's message never names an internal address
                log.warning("%s: nothing listening on %s", self.what, self.endpoint)
                raise LayaError(Kind.BUSY, "%s unavailable: nothing listening; retry shortly" % self.what)
            await asyncio.sleep(_RETRY_S)


class _IpcLink:
    def __init__(self, mux, reply_cls, what: str):
        self._mux, self._reply_cls, self.what = mux, reply_cls, what
        self.proto: Optional[_Frames] = None

    @property
    def open(self) -> bool:
        return self.proto is not None and self.proto.transport is not None and not self.proto.transport.is_closing()

    async def send(self, call, timeout: Optional[float]) -> None:
        if not self.proto.send(call.SerializeToString()):
            raise LayaError(Kind.BUSY, "%s unavailable: it closed the connection" % self.what)

    def cancel(self, cid: int) -> None:
        self.proto.send(self._mux.call_cls(id=cid).SerializeToString())

    def on_frame(self, frame: memoryview) -> None:
        try:
            reply = self._reply_cls.FromString(frame)
        except Exception:  # noqa: BLE001
            log.warning("%s: dropped an undecodable reply", self.what)
            return
        self._mux.reply(reply)

    def on_lost(self) -> None:
        self._mux.lost(self, LayaError(Kind.BUSY, "%s unavailable: it closed the connection" % self.what))

    def close(self) -> None:
        if self.proto is not None and self.proto.transport is not None:
            self.proto.transport.close()


def mux(endpoint: str, call_cls, reply_cls, what: str) -> CallMux:
    """Calls to the backend listening at an `ipc:///path` endpoint."""
    return CallMux(IpcTransport(endpoint, reply_cls, what), call_cls)
