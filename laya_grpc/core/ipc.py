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
`TokenizeCall`/`InferCall` one way and `TokenizeReply`/`InferReply` back, matched by id, so
`IpcMux.call` means exactly what `streams.StreamMux.call` means, cancellation included: a call
its caller no longer wants (cancelled, or past its timeout) is followed by a call message with the
same id and no request, and the server cancels that call's task without replying. A frame longer
than the internal message limit closes the connection (the peer is not one of ours); a reply that
would be longer is answered TOO_LARGE by `streams.reply_to` before it is sent.

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
import itertools
import logging
import os
import socket
import struct
import time
from dataclasses import dataclass
from typing import Awaitable, Callable, Optional
from urllib.parse import parse_qs

from .errors import Kind, LayaError
from .rpc import MAX_MESSAGE_BYTES
from .streams import error_from_call, reply_to

log = logging.getLogger("laya_grpc.core.ipc")
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
        self._tasks: dict = {}   # (connection, call id) -> its task
        self._conns: set = set()  # open connections (closed with the server)
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
            key = (proto, call.id)
            if not call.HasField("request"):   # the caller no longer wants this call: no reply is expected
                t = self._tasks.get(key)
                if t is not None:
                    t.cancel()
                return
            t = asyncio.ensure_future(self._one(proto, call))
            self._tasks[key] = t
            t.add_done_callback(lambda _, k=key: self._tasks.pop(k, None))

        def on_lost() -> None:   # the caller went away: its calls' work is not wanted any more
            self._conns.discard(proto)
            for key, t in list(self._tasks.items()):
                if key[0] is proto:
                    t.cancel()

        proto = _Frames(on_frame, on_lost, self.name)
        self._conns.add(proto)
        return proto

    async def _one(self, proto: _Frames, call) -> None:
        reply = await reply_to(call, self._handle, self._reply_cls, self._error_cls, self.name)
        proto.send(reply.SerializeToString())

    async def close(self) -> None:
        for t in list(self._tasks.values()):
            t.cancel()
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

class IpcMux:
    """Client side: `await mux.call(request, timeout)` behaves like `StreamMux.call`: the response,
    or a LayaError (the backend's own kind, TIMEOUT, or BUSY when it is unreachable or died).
    One connection, opened by the first call and again by the first call after it broke."""

    def __init__(self, endpoint: str, call_cls, reply_cls, what: str):
        self.endpoint, self.path = endpoint, _path(endpoint)
        self._call_cls, self._reply_cls, self.what = call_cls, reply_cls, what
        self._ids = itertools.count(1)
        self._pending: dict = {}
        self._proto: Optional[_Frames] = None
        self._connecting: Optional[asyncio.Future] = None
        self._closed = False

    async def call(self, request, timeout: Optional[float] = None):
        cid = next(self._ids)
        fut = asyncio.get_running_loop().create_future()
        payload = self._call_cls(id=cid, request=request).SerializeToString()
        self._pending[cid] = fut
        sent = False
        try:
            proto = self._proto
            if proto is None or not proto.send(payload):
                proto = await self._connect(timeout)
                if not proto.send(payload):
                    raise LayaError(Kind.BUSY, "%s unavailable: it closed the connection" % self.what)
            sent = True
            return await asyncio.wait_for(fut, timeout) if timeout else await fut
        except asyncio.TimeoutError:
            if sent:
                self._cancel_on_server(cid, fut)
            raise LayaError(Kind.TIMEOUT, "%s did not answer within %g s" % (self.what, timeout)) from None
        except asyncio.CancelledError:
            if sent:
                self._cancel_on_server(cid, fut)
            raise
        finally:
            self._pending.pop(cid, None)

    def _cancel_on_server(self, cid: int, fut: "asyncio.Future") -> None:
        """The call `cid`, sent and not answered, is no longer wanted: tell the server, which
        drops its queued work (a backend that is gone has dropped it anyway)."""
        if self._proto is not None and not (fut.done() and not fut.cancelled()):
            self._proto.send(self._call_cls(id=cid).SerializeToString())

    async def _connect(self, timeout: Optional[float]) -> _Frames:
        """The open connection, made now if there is none; concurrent callers share one attempt."""
        if self._closed:
            raise LayaError(Kind.BUSY, "%s connection closed by this process" % self.what)
        if self._connecting is None or self._connecting.done():
            self._connecting = asyncio.ensure_future(self._open(min(CONNECT_WAIT_S, timeout) if timeout
                                                                else CONNECT_WAIT_S))
        return await asyncio.shield(self._connecting)

    async def _open(self, wait_s: float) -> _Frames:
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + wait_s
        while True:
            try:
                _, proto = await loop.create_unix_connection(
                    lambda: _Frames(self._on_reply, self._on_lost, self.what), self.path)
                self._proto = proto
                return proto
            except OSError:
                pass
            if time.monotonic() >= deadline:
                # the socket path stays in this log: a client's message never names an internal address
                log.warning("%s: nothing listening on %s", self.what, self.endpoint)
                raise LayaError(Kind.BUSY, "%s unavailable: nothing listening; retry shortly" % self.what)
            await asyncio.sleep(_RETRY_S)

    def _on_reply(self, frame: memoryview) -> None:
        try:
            reply = self._reply_cls.FromString(frame)
        except Exception:  # noqa: BLE001
            log.warning("%s: dropped an undecodable reply", self.what)
            return
        fut = self._pending.get(reply.id)
        if fut is None or fut.done():   # its caller timed out or was cancelled
            return
        if reply.WhichOneof("result") == "error":
            fut.set_exception(error_from_call(reply.error))
        else:
            fut.set_result(reply.response)

    def _on_lost(self) -> None:
        """The connection dropped (the backend exited or was killed): every call in flight fails,
        as with a lost gRPC connection (they may or may not have run)."""
        self._proto = None
        err = LayaError(Kind.BUSY, "%s unavailable: it closed the connection" % self.what)
        for fut in list(self._pending.values()):
            if not fut.done():
                fut.set_exception(err)

    async def close(self) -> None:
        self._closed = True
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(LayaError(Kind.BUSY, "%s connection closed by this process" % self.what))
        if self._connecting is not None and not self._connecting.done():
            self._connecting.cancel()
        proto, self._proto = self._proto, None
        if proto is not None and proto.transport is not None:
            proto.transport.close()


def call_mux(link: Link, grpc_mux: Callable[[], object], call_cls, reply_cls, what: str):
    """The call carrier for one backend: IPC when its address says so, else `grpc_mux()`."""
    return IpcMux(link.ipc, call_cls, reply_cls, what) if link.ipc else grpc_mux()
