"""Id-tagged calls between our processes: one multiplexer over a pluggable transport.

Why: inside one host a grpc.aio unary call spends most of its round trip setting the call up
(~0.45 ms on the 2-core CI box against ~0.2 ms for a message on an open stream; 1.3-2.3x the
calls/s at 1-64 callers, docs/performance.md). So the gateway keeps one connection per backend
replica and sends each call as an id-tagged message (`TokenizeCall`, `InferCall`, `DecideCall`);
replies (`...Reply`) are matched by id.

`CallMux` (client side) owns the ids, the table of calls in flight, cancellation and failure; a
transport only opens a link and carries messages:
- `StreamTransport`: a long-lived gRPC stream (TokenizeStream, InferStream, DecideStream), across
  hosts; gRPC allows one read and one write in flight per stream: one reader task, writes under a
  lock;
- `core/wire/ipc.py` `IpcTransport`: length-framed messages on a unix socket, between serve's own
  processes;
- `UnaryTransport`: each call as its own unary RPC, for a `dns:///` backend whose replicas only
  gRPC's balanced channel knows.

Semantics are the unary call's: each call gets its response, or the LayaError the handler would
have raised (carried as a CallError, kind intact); a call has its own timeout; a broken link fails
the calls in flight on it like a failed connection (BUSY) and the next call opens a new one. A
call cancelled on the client side (its caller cancelled, or its timeout passed) is cancelled on
the server too, as a unary call's would be: the client sends a call message with the same id and
no request, and the server cancels that call's task (a forward pass or encode not yet started is
never run). `CallTable` is the server side of both message transports.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Awaitable, Callable, Optional

import grpc
from google.protobuf.message import DecodeError
from google.rpc import status_pb2

from . import rpc
from ..errors import KIND_METADATA_KEY, Kind, LayaError

log = logging.getLogger("laya_grpc.core.wire.calls")


def call_error(err: LayaError, proto_cls):
    """One call's error on a multiplexed link: its kind and detail, and the full google.rpc.Status
    a unary call would carry (rpc.status_of), so each call of a stream fails as `Decide` does."""
    return proto_cls(kind=err.kind.name, detail=err.detail, status=rpc.status_of(err).SerializeToString())


def error_from_call(e) -> LayaError:
    kind = Kind[e.kind] if e.kind in Kind.__members__ else Kind.INTERNAL
    err = LayaError(kind, e.detail)
    if kind is Kind.BUSY and e.status:   # its RetryInfo: a client waits it out before retrying
        st = status_pb2.Status()
        try:
            st.ParseFromString(e.status)
            err.retry_after_s = rpc.retry_delay_of(st)
        except DecodeError:
            pass
    return err


# ------------------------------------------------------------------------------------ server side

async def reply_to(call, handle: Callable[[object], Awaitable], reply_cls, error_cls, name: str):
    """The reply to one id-tagged call: its response, or the LayaError it raised (kind intact). A
    reply over the internal message limit is answered TOO_LARGE instead: sent, it would break the
    stream or connection and every call on it."""
    try:
        reply = reply_cls(id=call.id, response=await handle(call.request))
    except LayaError as e:
        return reply_cls(id=call.id, error=call_error(e, error_cls))
    except Exception as e:  # a bug: logged with traceback, the stream and the service keep serving
        log.exception("%s call failed", name)
        return reply_cls(id=call.id, error=call_error(
            LayaError(Kind.INTERNAL, "%s failed: %s: %s" % (name, type(e).__name__, e)), error_cls))
    size = reply.ByteSize()
    if size > rpc.MAX_MESSAGE_BYTES:
        return reply_cls(id=call.id, error=call_error(LayaError(
            Kind.TOO_LARGE, "%s reply of %d bytes is over the %d-byte message limit (LAYA_GRPC_MAX_MESSAGE_BYTES)"
            % (name, size, rpc.MAX_MESSAGE_BYTES)), error_cls))
    return reply


class CallTable:
    """Server side of one link (a gRPC stream or a unix socket connection): every call runs as its
    own task (so calls batch together exactly as concurrent unary calls do), its reply goes to
    `send` as it completes; a call message without a request cancels that call's task."""

    def __init__(self, handle: Callable[[object], Awaitable], send: Callable[[object], Awaitable], reply_cls,
                 error_cls, name: str):
        self._handle, self._send, self._reply_cls, self._error_cls, self.name = handle, send, reply_cls, error_cls, name
        self.tasks: dict = {}   # call id -> its task
        self.refusals: set = set()   # tasks writing the reply to a call refused on arrival

    def receive(self, call) -> None:
        if not call.HasField("request"):   # the caller no longer wants this call: no reply is expected
            t = self.tasks.get(call.id)
            if t is not None:
                t.cancel()
            return
        if call.id in self.tasks:   # an id must be unique among the calls in flight: each gets one reply
            err = LayaError(Kind.BAD_REQUEST, "call id %d is already in flight on this stream" % call.id)
            t = asyncio.ensure_future(self._send(self._reply_cls(id=call.id, error=call_error(err, self._error_cls))))
            self.refusals.add(t)
            t.add_done_callback(self.refusals.discard)
        else:
            t = asyncio.ensure_future(self._one(call))
            self.tasks[call.id] = t
            t.add_done_callback(lambda _, cid=call.id: self.tasks.pop(cid, None))
        t.add_done_callback(_retrieved)

    async def _one(self, call) -> None:
        await self._send(await reply_to(call, self._handle, self._reply_cls, self._error_cls, self.name))

    def running(self) -> list:
        """The tasks of this link that still hold work or a reply to write."""
        return [*self.tasks.values(), *self.refusals]

    async def finish(self) -> None:
        """The caller is done sending: finish what it asked for, refusals' replies included."""
        running = self.running()
        if running:
            await asyncio.gather(*running, return_exceptions=True)

    def cancel(self) -> None:
        """The caller went away: its calls' work is not wanted any more."""
        for t in list(self.tasks.values()):
            t.cancel()


async def serve_calls(calls, context: grpc.aio.ServicerContext, handle: Callable[[object], Awaitable],
                      reply_cls, error_cls, name: str, max_in_flight: Optional[int] = None) -> None:
    """Server side of a multiplexed gRPC stream; replies are written as they complete.

    `max_in_flight`: with that many calls running (their replies not yet written), the next call
    is not read until one ends. What the client sends meanwhile waits in HTTP/2 flow control (a
    window of bytes, then the client's writes block), so one stream holds bounded work and memory,
    also when its client never reads the replies. A cancel message behind that window is read when
    a call ends (each call is bounded by its own timeout and the admission queue time)."""
    lock = asyncio.Lock()

    async def send(reply) -> None:
        async with lock:
            try:
                await context.write(reply)
            except (grpc.aio.AbortError, grpc.aio.UsageError, asyncio.InvalidStateError):
                pass   # the stream ended (the client left, or it was aborted): nobody to answer

    table = CallTable(handle, send, reply_cls, error_cls, name)
    # The headers go out before any call is read. Otherwise the first reply's write carries them,
    # and a status sent while that write is in flight (an undecodable frame's INVALID_ARGUMENT,
    # rpc.UndecodableRequests) carries them too: gRPC's core refuses the second batch, and the
    # stream never ends for its client.
    try:
        await context.send_initial_metadata(())
    except Exception as e:  # noqa: BLE001 - cygrpc.ExecuteBatchError, which grpc does not export
        log.debug("%s stream ended before it began: %s", name, e)   # its client left: nobody to answer
        return
    try:
        async for call in calls:
            table.receive(call)
            while max_in_flight is not None and len(table.tasks) + len(table.refusals) >= max_in_flight:
                await asyncio.wait(table.running(), return_when=asyncio.FIRST_COMPLETED)
        await table.finish()   # then the stream ends
    finally:
        table.cancel()


def _retrieved(task: asyncio.Future) -> None:
    """Marks a task's outcome as seen (asyncio would log 'Task exception was never retrieved')."""
    if not task.cancelled():
        task.exception()


# ------------------------------------------------------------------------------------ client side

class CallMux:
    """Client side: `await mux.call(request, timeout)` behaves like `await stub.Method(request,
    timeout=...)` with errors already turned into LayaError. One link at a time, opened by the
    first call and again by the first call after it broke; concurrent callers share one attempt.

    A transport has `what` (the peer, for messages) and `async open(mux, timeout)` -> a link with
    `open` (still usable), `async send(call, timeout)` (raises LayaError when the link is broken),
    `cancel(call_id)` and `close()`; the link hands each reply to `mux.reply(reply)` (or
    `mux.settle`) and its end to `mux.lost(link, error)`."""

    def __init__(self, transport, call_cls):
        self._transport, self.call_cls, self.what = transport, call_cls, transport.what
        self._ids = itertools.count(1)
        self._pending: dict = {}   # call id -> (future, the link it was sent on)
        self._link = None
        self._opening: Optional[asyncio.Future] = None
        self._closed = False

    async def call(self, request, timeout: Optional[float] = None):
        cid = next(self._ids)
        fut = asyncio.get_running_loop().create_future()
        link = None
        try:
            link = self._link
            if link is None or not link.open:
                link = await self._open(timeout)
            self._pending[cid] = (fut, link)   # before the send: the reply may beat its return
            await link.send(self.call_cls(id=cid, request=request), timeout)
            return await asyncio.wait_for(fut, timeout) if timeout else await fut
        except asyncio.TimeoutError:
            self._cancel(cid, fut, link)
            raise LayaError(Kind.TIMEOUT, "%s did not answer within %g s" % (self.what, timeout)) from None
        except asyncio.CancelledError:
            self._cancel(cid, fut, link)
            raise
        finally:
            self._pending.pop(cid, None)

    def _cancel(self, cid: int, fut: asyncio.Future, link) -> None:
        """The call `cid`, sent and not answered, is no longer wanted: tell the server, which drops
        its queued work (a backend that is gone has dropped it anyway)."""
        if link is not None and link.open and cid in self._pending and not (fut.done() and not fut.cancelled()):
            link.cancel(cid)

    async def _open(self, timeout: Optional[float]):
        if self._closed:
            raise LayaError(Kind.BUSY, "%s connection closed by this process" % self.what)
        if self._opening is None or self._opening.done():
            self._opening = asyncio.ensure_future(self._transport.open(self, timeout))
        self._link = link = await asyncio.shield(self._opening)
        return link

    def settle(self, cid: int, response=None, error: Optional[LayaError] = None) -> None:
        entry = self._pending.get(cid)
        if entry is None or entry[0].done():   # its caller timed out or was cancelled
            return
        if error is not None:
            entry[0].set_exception(error)
        else:
            entry[0].set_result(response)

    def reply(self, reply) -> None:
        if reply.WhichOneof("result") == "error":
            self.settle(reply.id, error=error_from_call(reply.error))
        else:
            self.settle(reply.id, reply.response)

    def lost(self, link, err: LayaError) -> None:
        """Calls in flight on a dead link fail (they may or may not have run, as with a lost
        connection); calls already sent on a newer link are not touched."""
        if self._link is link:
            self._link = None
        for fut, on in list(self._pending.values()):
            if on is link and not fut.done():
                fut.set_exception(err)

    async def close(self) -> None:
        self._closed = True
        err = LayaError(Kind.BUSY, "%s connection closed by this process" % self.what)
        for fut, _ in self._pending.values():
            if not fut.done():
                fut.set_exception(err)
        if self._opening is not None and not self._opening.done():
            self._opening.cancel()
        link, self._link = self._link, None
        if link is not None:
            link.close()


class StreamTransport:
    """Calls on a long-lived gRPC stream, `open_stream()` (e.g. `stub.TokenizeStream`)."""

    def __init__(self, open_stream: Callable[[], object], what: str):
        self._open_stream, self.what = open_stream, what

    async def open(self, mux: CallMux, timeout: Optional[float]) -> "_StreamLink":
        return _StreamLink(self._open_stream(), mux, self.what)


class _StreamLink:
    def __init__(self, stream, mux: CallMux, what: str):
        self._stream, self._mux, self.what = stream, mux, what
        self._lock = asyncio.Lock()
        self._reader = asyncio.ensure_future(self._read())

    @property
    def open(self) -> bool:
        return not self._stream.done()

    async def send(self, call, timeout: Optional[float]) -> None:
        async with self._lock:
            try:
                await self._stream.write(call)
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError, grpc.aio.UsageError) as e:
                # the stream broke before this write: the reader fails the others; this one says why
                self._drop()
                raise self._broken(e) from None

    def cancel(self, cid: int) -> None:
        async def send() -> None:   # from a task of its own: the caller is being cancelled
            try:
                async with self._lock:
                    if not self._stream.done():
                        await self._stream.write(self._mux.call_cls(id=cid))
            except Exception:  # noqa: BLE001 - a broken stream has cancelled the call anyway
                pass
        asyncio.ensure_future(send())

    async def _read(self) -> None:
        try:
            async for reply in self._stream:
                self._mux.reply(reply)
            err = LayaError(Kind.BUSY, "%s unavailable: it closed the stream" % self.what)
        except asyncio.CancelledError:
            self._drop()
            self._mux.lost(self, LayaError(Kind.BUSY, "%s connection closed by this process" % self.what))
            raise
        except Exception as e:  # noqa: BLE001 - a broken stream, whatever broke it
            err = self._broken(e)
        self._drop()
        self._mux.lost(self, err)

    def _drop(self) -> None:
        if not self._stream.done():
            self._stream.cancel()

    def _broken(self, e) -> LayaError:
        """A stream fails as a whole only when the transport does (the services answer every call
        on it, errors included, as a reply): BUSY, retryable, as a unary call to a backend that is
        down; an error that names its own kind keeps it."""
        if isinstance(e, grpc.aio.AioRpcError):
            err = rpc.error_from_rpc(e, self.what)
            tagged = any(k == KIND_METADATA_KEY for k, _ in (e.trailing_metadata() or ()))
            if err.kind is Kind.INTERNAL and not tagged:   # e.g. "Internal error from Core" on a write
                log.warning("%s stream: %s: %s", self.what, e.code().name, e.details())
                return LayaError(Kind.BUSY, rpc.transport_detail(self.what))
            return err
        return LayaError(Kind.BUSY, "%s unavailable: stream broken (%s)" % (self.what, type(e).__name__))

    def close(self) -> None:
        self._reader.cancel()
        self._drop()


class UnaryTransport:
    """Each call as its own unary RPC, `method(request, timeout=...)`: a backend behind a channel
    that gRPC balances (a `dns:///` name), where a stream would stay pinned to one replica."""

    def __init__(self, method, what: str):
        self._method, self.what = method, what

    async def open(self, mux: CallMux, timeout: Optional[float]) -> "_UnaryLink":
        return _UnaryLink(self._method, mux, self.what)


class _UnaryLink:
    open = True

    def __init__(self, method, mux: CallMux, what: str):
        self._method, self._mux, self.what = method, mux, what
        self._tasks: dict = {}

    async def send(self, call, timeout: Optional[float]) -> None:
        t = asyncio.ensure_future(self._run(call.id, call.request, timeout))
        self._tasks[call.id] = t
        t.add_done_callback(lambda _, cid=call.id: self._tasks.pop(cid, None))

    async def _run(self, cid: int, request, timeout: Optional[float]) -> None:
        try:
            self._mux.settle(cid, await self._method(request, timeout=timeout))
        except grpc.aio.AioRpcError as e:
            self._mux.settle(cid, error=rpc.error_from_rpc(e, self.what))

    def cancel(self, cid: int) -> None:
        t = self._tasks.get(cid)
        if t is not None:
            t.cancel()

    def close(self) -> None:
        for t in list(self._tasks.values()):
            t.cancel()


def stream_mux(open_stream: Callable[[], object], call_cls, what: str) -> CallMux:
    """Calls on a long-lived gRPC stream, `open_stream()` (e.g. `stub.TokenizeStream`)."""
    return CallMux(StreamTransport(open_stream, what), call_cls)
