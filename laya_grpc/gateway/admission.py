"""Bounded, non-blocking admission and the capped, time-limited body read (upstream `laya serve`).

Admission is taken BEFORE the body is read, which bounds how many bodies are buffered at once;
when every slot is taken the request is refused at once (503, `Retry-After: 1`) rather than
queued. Because the slot is held while the body arrives, the read has a deadline
(`LAYA_BODY_READ_TIMEOUT`): a stalled upload gets 408 and frees its slot instead of holding it for
as long as its socket stays open.
"""
from __future__ import annotations

import asyncio
from typing import Optional

from laya_grpc.core import memory, metrics
from laya_grpc.core.errors import Kind, LayaError

MAX_BODY_BYTES = 2 * 1024 * 1024
# request bytes after which an idle gateway gives freed heap back (core/memory.py): a 2 MiB body is
# parsed into many objects and copied into the tokenizer's request, and glibc keeps what they free
TRIM_AFTER_BYTES = 1024 * 1024
_timeout = getattr(asyncio, "timeout", None)   # Python 3.11+; 3.10 (still supported) uses wait_for

BUSY_DETAIL = "server busy, try again later"
TOO_LARGE_DETAIL = "request body too large"
TIMEOUT_DETAIL = "request body was not received in time"


class Admission:
    """At most `limit` decision requests past auth at once, over HTTP and gRPC together; the rest
    are refused immediately (HTTP 503 + Retry-After, gRPC RESOURCE_EXHAUSTED + retry-after).
    Nobody ever waits for a slot, so a counter on the event loop's thread is the whole mechanism.

    The same counter says when the gateway is idle: `trim` gives freed heap back once no slot has
    been taken for a moment after large requests (their bytes are `trim.add`ed by the fronts). The
    gateway has no worker thread of its own, so the trim runs in the event loop's default executor."""

    def __init__(self, limit: int):
        self.limit = limit
        self.taken = 0
        self.trim = memory.IdleTrim(lambda: self.taken, lambda fn: asyncio.get_running_loop().run_in_executor(None, fn),
                                    TRIM_AFTER_BYTES, metrics.GATEWAY_HEAP_TRIMS)

    def slot(self) -> "Admission":
        """`async with admission.slot():` holds one slot (a plain async context manager: cheaper
        per request than a generator-based one)."""
        return self

    def try_acquire(self) -> bool:
        """Take a slot if one is free (never waits)."""
        if self.taken >= self.limit:
            return False
        self.taken += 1
        return True

    def release(self) -> None:
        self.taken -= 1
        self.trim.ended()

    async def __aenter__(self) -> None:
        if not self.try_acquire():
            raise LayaError(Kind.BUSY, BUSY_DETAIL)

    async def __aexit__(self, *exc) -> None:
        self.release()


async def read_body(receive_stream, content_length: Optional[str], timeout: float) -> bytes:
    """The whole body, refusing more than 2 MiB (declared or streamed) and stalls past `timeout`.

    `receive_stream` is Starlette's `request.stream()`. A `Content-Length` over the cap is refused
    before any byte is read; a malformed one is ignored here (uvicorn refuses it first).
    """
    if content_length:
        try:
            declared = int(content_length)
        except ValueError:
            declared = 0
        if declared > MAX_BODY_BYTES:
            raise LayaError(Kind.TOO_LARGE, TOO_LARGE_DETAIL)

    async def collect() -> bytes:
        total = 0
        chunks = []
        async for chunk in receive_stream:
            if not chunk:
                continue
            total += len(chunk)
            if total > MAX_BODY_BYTES:
                raise LayaError(Kind.TOO_LARGE, TOO_LARGE_DETAIL)
            chunks.append(chunk)
        return b"".join(chunks)

    try:
        if _timeout is not None:
            async with _timeout(timeout):   # in this task: wait_for starts another one (before 3.12)
                return await collect()
        return await asyncio.wait_for(collect(), timeout=timeout)
    except asyncio.TimeoutError:            # TimeoutError itself from 3.11 on
        raise LayaError(Kind.TIMEOUT, TIMEOUT_DETAIL) from None
