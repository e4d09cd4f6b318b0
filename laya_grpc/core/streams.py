"""Unary calls multiplexed on one long-lived gRPC stream (TokenizeStream, InferStream).

Why: inside one host a grpc.aio unary call spends most of its round trip setting the call up
(~0.45 ms on the 2-core CI box against ~0.2 ms for a message on an open stream; 1.3-2.3x the
calls/s at 1-64 callers, docs/performance.md). The gateway makes two internal calls per request,
so it keeps one stream per backend and sends each call as an id-tagged message.

Semantics are the unary call's: each call gets its response, or the LayaError the unary handler
would have raised (carried as a CallError, kind intact); a call has its own timeout; a broken
stream fails the calls in flight on it like a failed connection (BUSY when the backend is
unreachable) and the next call opens a new stream. A call cancelled on the client side (its caller
cancelled, or its timeout passed) is cancelled on the server too, as a unary call's would be: the
client sends a call message with the same id and no request, and the server cancels that call's
task (a forward pass or encode not yet started is never run). gRPC allows one read and one write in flight
per stream: one reader task per stream here, writes under a lock on both sides.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Awaitable, Callable, Optional

import grpc

from . import rpc
from .errors import KIND_METADATA_KEY, Kind, LayaError

log = logging.getLogger("laya_grpc.core.streams")


def call_error(err: LayaError, proto_cls):
    return proto_cls(kind=err.kind.name, detail=err.detail)


def error_from_call(e) -> LayaError:
    kind = Kind[e.kind] if e.kind in Kind.__members__ else Kind.INTERNAL
    return LayaError(kind, e.detail)


async def reply_to(call, handle: Callable[[object], Awaitable], reply_cls, error_cls, name: str):
    """The reply to one id-tagged call (on a stream here, or over IPC, core/ipc.py): its response,
    or the LayaError it raised (kind intact). A reply over the internal message limit is answered
    TOO_LARGE instead: sent, it would break the stream or connection and every call on it."""
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


async def serve_calls(calls, context: grpc.aio.ServicerContext, handle: Callable[[object], Awaitable],
                      reply_cls, error_cls, name: str) -> None:
    """Server side of a multiplexed stream: every call runs as its own task (so calls batch
    together exactly as concurrent unary calls do); replies are written as they complete."""
    lock = asyncio.Lock()
    tasks: dict = {}   # call id -> its task

    async def write(reply) -> None:
        async with lock:
            try:
                await context.write(reply)
            except (grpc.aio.AbortError, grpc.aio.UsageError, asyncio.InvalidStateError):
                pass   # the stream ended (the client left, or it was aborted): nobody to answer

    async def one(call) -> None:
        await write(await reply_to(call, handle, reply_cls, error_cls, name))

    try:
        async for call in calls:
            if not call.HasField("request"):   # the client cancelled this call: no reply is expected
                t = tasks.get(call.id)
                if t is not None:
                    t.cancel()
                continue
            if call.id in tasks:   # an id must be unique among the calls in flight: each gets one reply
                await write(reply_cls(id=call.id, error=call_error(LayaError(
                    Kind.BAD_REQUEST, "call id %d is already in flight on this stream" % call.id), error_cls)))
                continue
            t = asyncio.ensure_future(one(call))
            tasks[call.id] = t
            t.add_done_callback(lambda _, cid=call.id: tasks.pop(cid, None))
        if tasks:   # the caller is done writing: finish what it asked for, then end the stream
            await asyncio.gather(*list(tasks.values()), return_exceptions=True)
    finally:
        for t in list(tasks.values()):
            t.cancel()
            t.add_done_callback(_retrieved)


def _retrieved(task: asyncio.Future) -> None:
    """Marks a task's outcome as seen (asyncio would log 'Task exception was never retrieved')."""
    if not task.cancelled():
        task.exception()


class StreamMux:
    """Client side: `await mux.call(request, timeout)` behaves like `await stub.Method(request,
    timeout=...)` with errors already turned into LayaError."""

    def __init__(self, open_stream: Callable[[], object], call_cls, what: str):
        self._open_stream, self._call_cls, self.what = open_stream, call_cls, what
        self._ids = itertools.count(1)
        self._stream = None
        self._reader: Optional[asyncio.Task] = None
        self._pending: dict = {}
        self._lock = asyncio.Lock()

    async def call(self, request, timeout: Optional[float] = None):
        cid = next(self._ids)
        fut = asyncio.get_running_loop().create_future()
        stream = None
        try:
            async with self._lock:
                stream = self._ensure_stream()
                self._pending[cid] = (fut, stream)   # before the write: the reply may beat its return
                try:
                    await stream.write(self._call_cls(id=cid, request=request))
                except (grpc.aio.AioRpcError, asyncio.InvalidStateError, grpc.aio.UsageError) as e:
                    # the stream broke before this write: the reader fails the others; this one says why
                    self._drop(stream)
                    stream = None
                    raise self._broken(e) from None
            return await asyncio.wait_for(fut, timeout) if timeout else await fut
        except asyncio.TimeoutError:
            self._cancel_on_server(cid, stream)
            raise LayaError(Kind.TIMEOUT, "%s did not answer within %g s" % (self.what, timeout)) from None
        except asyncio.CancelledError:
            self._cancel_on_server(cid, stream)
            raise
        finally:
            self._pending.pop(cid, None)

    def _cancel_on_server(self, cid: int, stream) -> None:
        """The call `cid`, written on `stream` and not answered, is no longer wanted: tell the
        server (from a task of its own: the caller is being cancelled)."""
        if stream is None or stream.done() or (cid in self._pending and self._pending[cid][0].done()):
            return

        async def send() -> None:
            try:
                async with self._lock:
                    if not stream.done():
                        await stream.write(self._call_cls(id=cid))
            except Exception:  # noqa: BLE001 - a broken stream has cancelled the call anyway
                pass
        asyncio.ensure_future(send())

    def _ensure_stream(self):
        if self._stream is None or self._stream.done():
            self._stream = stream = self._open_stream()
            self._reader = asyncio.ensure_future(self._read(stream))
        return self._stream

    async def _read(self, stream) -> None:
        try:
            async for reply in stream:
                entry = self._pending.get(reply.id)
                if entry is None or entry[0].done():   # its caller timed out or was cancelled
                    continue
                if reply.WhichOneof("result") == "error":
                    entry[0].set_exception(error_from_call(reply.error))
                else:
                    entry[0].set_result(reply.response)
            err = LayaError(Kind.BUSY, "%s unavailable: it closed the stream" % self.what)
        except asyncio.CancelledError:
            self._fail_stream(stream, LayaError(Kind.BUSY, "%s stream closed by this process" % self.what))
            raise
        except Exception as e:  # noqa: BLE001 - a broken stream, whatever broke it
            err = self._broken(e)
        self._fail_stream(stream, err)

    def _fail_stream(self, stream, err: LayaError) -> None:
        """Calls in flight on a dead stream fail (they may or may not have run, as with a lost
        connection); calls already written to a newer stream are not touched."""
        self._drop(stream)
        for fut, s in list(self._pending.values()):
            if s is stream and not fut.done():
                fut.set_exception(err)

    def _drop(self, stream) -> None:
        if self._stream is stream:
            self._stream = None
        if not stream.done():
            stream.cancel()

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

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
        if self._stream is not None and not self._stream.done():
            self._stream.cancel()
