"""Concurrent requests' rows for one checkpoint share Infer RPCs.

Under load every request paying its own gateway->inference round trip makes the inference
service's RPC handling the ceiling. Here at most `max_inflight` Infer calls per checkpoint are in
flight; rows of requests that arrive meanwhile wait and go together in the next call (up to
`max_rows`), which also hands the device thread bigger batches. With no load a request goes out
at once, from its own task: no timer, no added latency.

A request whose rows alone fill a shared call (`max_rows` rows or `max_tokens` tokens) goes out
at once from its own task, beside the lanes: it neither waits for nor holds a lane's slot, so the
small requests that arrive meanwhile still go out at once. Its rows are not cut here: the
inference batcher gives a large request the device one turn at a time, between other requests
(inference/batcher.py).

Cancellation: when the request's task is cancelled (client gone, deadline passed) its call is
cancelled at the inference service too (the call multiplexer sends a cancel for it): its rows not
yet run are dropped from the device queue.
"""
from __future__ import annotations

import asyncio
import collections
import contextvars
from dataclasses import dataclass, field
from typing import Awaitable, Callable

from laya_grpc.core.runtime import metrics, request_id, tracing
from laya_grpc.core.wire.packed_rows import PackedRows

# (request id, traceparent) of each request whose rows the Infer call being made carries
_ORIGINS: contextvars.ContextVar = contextvars.ContextVar("laya_infer_origins", default=None)


def origins() -> list:
    """The requests of the Infer call made from this task: the merged ones, else the current one."""
    merged = _ORIGINS.get()
    return merged if merged is not None else [(request_id.current_id(), tracing.traceparent())]


# tokens of rows that fill a shared call on their own (with `max_rows`): such a request goes out alone
MAX_SHARED_TOKENS = 8192


@dataclass
class _Lane:
    pending: collections.deque = field(default_factory=collections.deque)   # (PackedRows, Future, origin)
    inflight: int = 0


class InferCoalescer:
    def __init__(self, call: Callable[[str, PackedRows], Awaitable], max_inflight: int = 2, max_rows: int = 256,
                 max_tokens: int = MAX_SHARED_TOKENS):
        self._call, self.max_inflight, self.max_rows, self.max_tokens = call, max_inflight, max_rows, max_tokens
        self._lanes: dict[str, _Lane] = {}

    async def submit(self, checkpoint: str, rows: PackedRows):
        """(response, merged rows, index of this request's first row in them)."""
        lane = self._lanes.setdefault(checkpoint, _Lane())
        held = not (rows.n >= self.max_rows or len(rows.ids) >= self.max_tokens)   # else beside the lanes
        if not held or (not lane.pending and lane.inflight < self.max_inflight):
            # Nothing to share it with: call from this task (no helper task, no future hand-off).
            lane.inflight += held
            try:
                metrics.INFER_CALL_REQUESTS.observe(1)
                return await self._call(checkpoint, rows), rows, 0
            finally:
                lane.inflight -= held
                if held and lane.pending:
                    self._launch(checkpoint, lane)
        fut = asyncio.get_running_loop().create_future()
        lane.pending.append((rows, fut, (request_id.current_id(), tracing.traceparent())))
        if lane.inflight < self.max_inflight:
            self._launch(checkpoint, lane)
        return await fut

    def _launch(self, checkpoint: str, lane: _Lane) -> None:
        batch, n = [], 0
        while lane.pending and (not batch or n + lane.pending[0][0].n <= self.max_rows):
            rows, fut, origin = lane.pending.popleft()
            if fut.cancelled():
                continue
            batch.append((rows, fut, origin))
            n += rows.n
        if not batch:
            return
        lane.inflight += 1
        asyncio.ensure_future(self._run(checkpoint, lane, batch))

    async def _run(self, checkpoint: str, lane: _Lane, batch: list) -> None:
        try:
            merged = PackedRows.concat([rows for rows, _, _ in batch])
            metrics.INFER_CALL_REQUESTS.observe(len(batch))
            _ORIGINS.set([origin for _, _, origin in batch])
            resp = await self._call(checkpoint, merged)
            start = 0
            for rows, fut, _ in batch:
                if not fut.done():
                    fut.set_result((resp, merged, start))
                start += rows.n
        except BaseException as e:  # noqa: BLE001 - every waiter of this call gets the failure
            for _, fut, _ in batch:
                if not fut.done():
                    fut.set_exception(e)
        finally:
            lane.inflight -= 1
            if lane.pending:
                self._launch(checkpoint, lane)
