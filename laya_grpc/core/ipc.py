"""Tokenize and Infer calls between processes of one host over ZeroMQ unix sockets (pyzmq).

Why: a message on an open grpc.aio stream still pays HTTP/2 framing and grpc's completion-queue
thread handoffs; the gateway makes two internal calls per request. ZeroMQ over an `ipc://` unix
socket carries the same bytes with one syscall each way (vLLM's API server talks to its engine
the same way). Measured on the 2-core CI box, an empty call to another process: p50 0.10 ms
against 0.18 ms on a gRPC stream, 21,000 against 4,100 calls/s with 64 callers
(`python -m benchmarks.hops --empty`). The payload is unchanged: each ZeroMQ message is one serialized contract message,
`TokenizeCall`/`InferCall` one way and `TokenizeReply`/`InferReply` back, matched by id, so
`IpcMux.call` means exactly what `streams.StreamMux.call` means, cancellation included: a call
its caller no longer wants (cancelled, or past its timeout) is followed by a call message with the
same id and no request, and the server cancels that call's task without replying.

Addresses. A backend reached over IPC is named `ipc:///path/x.ipc?grpc=<its gRPC address>`:
calls go over the ZeroMQ socket, while health (grpc.health.v1 Watch), WatchStatus and
LoadCheckpoint stay on the service's gRPC address, which every service keeps. Any other
address is gRPC as before (remote endpoints and the public API never use IPC).

Peer death. ZeroMQ reconnects silently and reports nothing to the sender, so the client watches
its socket's monitor: when the unix connection drops (the backend exited or was killed), every
call in flight fails at once with BUSY, as a broken gRPC stream does; with ZMQ_IMMEDIATE a call
made while no backend is connected fails with BUSY instead of waiting in a queue. A backend that
is alive but stuck is caught by each call's own timeout.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import struct
import time
from dataclasses import dataclass
from typing import Awaitable, Callable, Optional
from urllib.parse import parse_qs

import zmq

from . import flags
from .errors import Kind, LayaError
from .rpc import MAX_MESSAGE_BYTES
from .streams import error_from_call, reply_to

log = logging.getLogger("laya_grpc.core.ipc")
SCHEME = "ipc://"
CONNECT_WAIT_S = 1.0    # a call made before the socket's first connection completes waits this long for it


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


def _check_endpoint(endpoint: str) -> str:
    if not endpoint.startswith(SCHEME) or len(endpoint) <= len(SCHEME):
        raise LayaError(Kind.INVALID, "IPC endpoint %r must be ipc:///path" % endpoint)
    return endpoint


# ------------------------------------------------------------------------------------ server side

class IpcServer:
    """A ROUTER socket bound to `endpoint`: every call runs as its own task (so calls batch
    together exactly as concurrent gRPC calls do) and its reply goes back to the caller's socket.

    A plain (blocking-API) socket driven by the event loop: `add_reader` on its notification fd,
    then every message ready is read without blocking. Cheaper than a Future per message
    (zmq.asyncio); the fd is edge-triggered, so the socket is drained again after each send."""

    def __init__(self, endpoint: str, handle: Callable[[object], Awaitable], call_cls, reply_cls, error_cls,
                 name: str):
        self.endpoint = _check_endpoint(endpoint)
        self._handle, self._call_cls, self._reply_cls, self._error_cls = handle, call_cls, reply_cls, error_cls
        self.name = name
        self._sock = _socket(zmq.ROUTER)
        try:
            self._sock.bind(endpoint)
        except zmq.ZMQError as e:
            self._sock.close()
            raise LayaError(Kind.INVALID, "cannot listen on %s: %s" % (endpoint, e)) from None
        self._tasks: dict = {}   # (peer, call id) -> its task
        self._loop = None

    def start(self) -> "IpcServer":
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._sock.getsockopt(zmq.FD), self._drain)
        self._loop.call_soon(self._drain)
        return self

    def _drain(self) -> None:
        sock = self._sock
        while not sock.closed and sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            if len(frames) != 2:
                continue    # not one of ours: a ROUTER message is [peer id, payload]
            try:
                call = self._call_cls.FromString(frames[1].buffer)
            except Exception:  # noqa: BLE001 - undecodable bytes: nothing to answer to (no id)
                log.warning("%s: dropped an undecodable message on %s", self.name, self.endpoint)
                continue
            key = (frames[0].bytes, call.id)
            if not call.HasField("request"):   # the caller no longer wants this call: no reply is expected
                t = self._tasks.get(key)
                if t is not None:
                    t.cancel()
                continue
            t = asyncio.ensure_future(self._one(key[0], call))
            self._tasks[key] = t
            t.add_done_callback(lambda _, k=key: self._tasks.pop(k, None))

    async def _one(self, peer: bytes, call) -> None:
        reply = await reply_to(call, self._handle, self._reply_cls, self._error_cls, self.name)
        if not self._sock.closed:
            self._sock.send_multipart([peer, reply.SerializeToString()], zmq.NOBLOCK)
            self._drain()

    async def close(self) -> None:
        for t in list(self._tasks.values()):
            t.cancel()
        if self._loop is not None and not self._sock.closed:
            self._loop.remove_reader(self._sock.getsockopt(zmq.FD))
        self._sock.close(linger=0)


def _socket(kind: int):
    sock = zmq.Context.instance().socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 0)   # no message limit: a send never blocks or drops (calls are bounded upstream)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)   # gRPC's limit: a larger message drops the connection
    return sock


# ------------------------------------------------------------------------------------ client side

_EVENT = struct.Struct("=HI")   # monitor frame 0: event id (uint16), value (uint32)


class IpcMux:
    """Client side: `await mux.call(request, timeout)` behaves like `StreamMux.call`: the response,
    or a LayaError (the backend's own kind, TIMEOUT, or BUSY when it is unreachable or died).
    Driven by the event loop like `IpcServer`; its monitor socket the same way."""

    def __init__(self, endpoint: str, call_cls, reply_cls, what: str):
        self.endpoint, self._call_cls, self._reply_cls, self.what = _check_endpoint(endpoint), call_cls, reply_cls, what
        self._ids = itertools.count(1)
        self._pending: dict = {}
        self._sock = self._monitor = self._loop = None
        self._connected: Optional[asyncio.Event] = None

    def _ensure_socket(self):
        if self._sock is None:
            sock = _socket(zmq.DEALER)
            sock.setsockopt(zmq.IMMEDIATE, 1)          # no queueing towards a backend that is not connected
            sock.setsockopt(zmq.RECONNECT_IVL, 100)    # a restarted child is picked up within 0.1 s
            sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
            monitor = sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
            sock.connect(self.endpoint)
            self._sock, self._monitor, self._connected = sock, monitor, asyncio.Event()
            self._loop = asyncio.get_running_loop()
            self._loop.add_reader(sock.getsockopt(zmq.FD), self._drain)
            self._loop.add_reader(monitor.getsockopt(zmq.FD), self._watch)
            self._loop.call_soon(self._watch)
        return self._sock

    async def call(self, request, timeout: Optional[float] = None):
        cid = next(self._ids)
        fut = asyncio.get_running_loop().create_future()
        sock = self._ensure_socket()
        payload = self._call_cls(id=cid, request=request).SerializeToString()
        self._pending[cid] = fut
        sent = False
        try:
            await self._send(sock, payload, timeout)
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
        sock = self._sock
        if sock is None or sock.closed or (fut.done() and not fut.cancelled()):
            return
        try:
            sock.send(self._call_cls(id=cid).SerializeToString(), zmq.NOBLOCK, copy=False)
        except zmq.ZMQError:
            pass

    async def _send(self, sock, payload: bytes, timeout: Optional[float]) -> None:
        """Send at once, or, while no backend is connected (IMMEDIATE refuses to queue), retry for a
        short while: a new socket's first connection, or a restarted child, takes a few ms to attach."""
        deadline = time.monotonic() + (min(CONNECT_WAIT_S, timeout) if timeout else CONNECT_WAIT_S)
        while True:
            try:
                sock.send(payload, zmq.NOBLOCK, copy=False)
                self._drain()   # the fd is edge-triggered: a reply that came in meanwhile is read now
                return
            except zmq.Again:
                pass
            left = deadline - time.monotonic()
            if left <= 0:
                # the socket path stays in this log: a client's message never names an internal address
                log.warning("%s: nothing listening on %s", self.what, self.endpoint)
                raise LayaError(Kind.BUSY, "%s unavailable: nothing listening; retry shortly" % self.what)
            try:   # the monitor's connect event wakes this early; the pipe attaches just after it
                await asyncio.wait_for(self._connected.wait(), min(left, 0.02))
            except asyncio.TimeoutError:
                pass
            await asyncio.sleep(0.002 if self._connected.is_set() else 0)

    def _drain(self) -> None:
        sock = self._sock
        while sock is not None and not sock.closed and sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            frame = sock.recv(zmq.NOBLOCK, copy=False)
            try:
                reply = self._reply_cls.FromString(frame.buffer)
            except Exception:  # noqa: BLE001
                log.warning("%s: dropped an undecodable reply", self.what)
                continue
            fut = self._pending.get(reply.id)
            if fut is None or fut.done():   # its caller timed out or was cancelled
                continue
            if reply.WhichOneof("result") == "error":
                fut.set_exception(error_from_call(reply.error))
            else:
                fut.set_result(reply.response)

    def _watch(self) -> None:
        """Connection events: a dropped connection fails every call in flight (they may or may not
        have run, as with a lost gRPC connection)."""
        mon = self._monitor
        while mon is not None and not mon.closed and mon.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            frames = mon.recv_multipart(zmq.NOBLOCK)
            event, _ = _EVENT.unpack(frames[0][:_EVENT.size])
            if event == zmq.EVENT_CONNECTED:
                self._connected.set()
            elif event == zmq.EVENT_DISCONNECTED:
                self._connected.clear()
                err = LayaError(Kind.BUSY, "%s unavailable: it closed the connection" % self.what)
                for fut in list(self._pending.values()):
                    if not fut.done():
                        fut.set_exception(err)

    async def close(self) -> None:
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(LayaError(Kind.BUSY, "%s connection closed by this process" % self.what))
        if self._sock is not None:
            self._loop.remove_reader(self._sock.getsockopt(zmq.FD))
            self._loop.remove_reader(self._monitor.getsockopt(zmq.FD))
            self._sock.disable_monitor()
            self._monitor.close(linger=0)
            self._sock.close(linger=0)
            self._sock = self._monitor = None


def call_mux(link: Link, grpc_mux: Callable[[], object], call_cls, reply_cls, what: str):
    """The call carrier for one backend: IPC when its address says so, else `grpc_mux()`."""
    return IpcMux(link.ipc, call_cls, reply_cls, what) if link.ipc else grpc_mux()


def add_flag(p, env: str, calls: str) -> None:
    flags.add(p, "--ipc", env=env, default=None, metavar="ipc:///PATH",
              help="also take %s calls over ZeroMQ on this unix socket (cheaper than gRPC between processes "
                   "of one host; 'serve' uses it for its own children); health, status and the other RPCs "
                   "stay on --listen" % calls)
