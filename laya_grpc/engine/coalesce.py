"""Concurrent requests' rows for one checkpoint share Infer RPCs; large requests take turns.

Under load every request paying its own gateway->inference round trip makes the inference
service's RPC handling the ceiling. Here at most `max_inflight` Infer calls per checkpoint are in
flight; rows of requests that arrive meanwhile wait and go together in the next call (up to
`max_rows`), which also hands the device thread bigger batches. With no load a request goes out
at once, from its own task: no timer, no added latency.

Fairness: a request whose rows would take the device longer than `chunk_ms` is cut into chunks
(whole rows) that each take about that long, sent one after the other, each as its own Infer
call outside the shared lanes: it never takes a lane's slot, so the requests that arrive
meanwhile go out at once and reach the device's queue while one chunk runs. A small request
therefore waits for about one chunk's forward pass, however large the request before it (a
maximal upstream batch, 4,096 rows, no longer holds the device for the whole batch). A chunk's
size in tokens follows the device's measured speed (each reply's `model_ms` over the tokens its
forward ran, averaged per checkpoint): a few thousand tokens on a CPU, and shrinking when the
host is loaded; tens of thousands on a GPU, where a large batch is then rarely cut at all and the
gateway round trip per chunk (~1 ms) stays small beside the chunk.

Cancellation: when the request's task is cancelled (client gone, deadline passed) its chunks not
yet sent are never sent, and the one in flight is cancelled at the inference service too
(StreamMux sends a cancel for it): dropped from the device queue, or, if its forward pass is
already running, that one pass finishes.
"""
from __future__ import annotations

import asyncio
import collections
import contextvars
from dataclasses import dataclass, field
from typing import Awaitable, Callable

import numpy as np

from laya_grpc.core import metrics, request_id, tracing
from laya_grpc.core.turns import TURN_MS, DeviceSpeed
from laya_grpc.core.packed_rows import PackedRows
from laya_proto.v1 import inference_pb2

# (request id, traceparent) of each request whose rows the Infer call being made carries
_ORIGINS: contextvars.ContextVar = contextvars.ContextVar("laya_infer_origins", default=None)


def origins() -> list:
    """The requests of the Infer call made from this task: the merged ones, else the current one
    (also for each chunk of a large request: chunks are sent from its own task)."""
    merged = _ORIGINS.get()
    return merged if merged is not None else [(request_id.current_id(), tracing.traceparent())]


DEFAULT_CHUNK_MS = TURN_MS
FIRST_CHUNK_TOKENS = 2048      # before any speed is known: ~50 ms on the 2-core CI box (tiny checkpoints)
MIN_CHUNK_TOKENS = 256
MAX_CHUNK_TOKENS = 65536


@dataclass
class _Lane:
    pending: collections.deque = field(default_factory=collections.deque)   # (PackedRows, Future, origin)
    inflight: int = 0


def split_rows(rows: PackedRows, max_tokens: int) -> list[PackedRows]:
    """`rows` as consecutive chunks of whole rows, each at most `max_tokens` tokens (a longer row
    is a chunk of its own)."""
    lengths = rows.lengths
    if rows.n <= 1 or int(lengths.sum()) <= max_tokens:
        return [rows]
    bounds, start, acc = [], 0, 0
    for i, n in enumerate(lengths.tolist()):
        if i > start and acc + n > max_tokens:
            bounds.append((start, i))
            start, acc = i, 0
        acc += n
    bounds.append((start, rows.n))
    return [rows.take(range(a, b)) for a, b in bounds]


def join_responses(parts: list, rows: PackedRows) -> inference_pb2.InferResponse:
    """One InferResponse for `rows` from its chunks' (response, merged rows, start, n): each
    chunk's slice of a possibly shared call, concatenated in row order."""
    logits, probs, acts = [], [], []
    first = parts[0][0]
    n_act = max(1, first.n_act)
    for resp, merged, start, n in parts:
        mo = merged.marker_offsets
        a, b = int(mo[start]), int(mo[start + n])
        logits.append(np.frombuffer(resp.logits, dtype="<f4")[a:b])
        if resp.probabilities:
            probs.append(np.frombuffer(resp.probabilities, dtype="<f4")[a:b])
        acts.append(np.frombuffer(resp.act_logits, dtype="<f4").reshape(merged.n, n_act)[start:start + n])
    return inference_pb2.InferResponse(
        logits=np.concatenate(logits).tobytes(), probabilities=np.concatenate(probs).tobytes() if probs else b"",
        act_logits=np.concatenate(acts).tobytes(), n_act=first.n_act, device=first.device, dtype=first.dtype,
        queue_ms=sum(p[0].queue_ms for p in parts), model_ms=sum(p[0].model_ms for p in parts),
        batch_rows=max(p[0].batch_rows for p in parts))


class InferCoalescer:
    def __init__(self, call: Callable[[str, PackedRows], Awaitable], max_inflight: int = 2, max_rows: int = 256,
                 chunk_ms: float = DEFAULT_CHUNK_MS, first_chunk_tokens: int = FIRST_CHUNK_TOKENS,
                 join: Callable[[list, PackedRows], object] = join_responses):
        self._call, self.max_inflight, self.max_rows = call, max_inflight, max_rows
        self.chunk_ms, self.first_chunk_tokens, self._join = chunk_ms, first_chunk_tokens, join
        self._lanes: dict[str, _Lane] = {}
        self._speed = DeviceSpeed()   # forward ms per token, per checkpoint

    def chunk_tokens(self, checkpoint: str) -> int:
        """Tokens one chunk may hold: about `chunk_ms` of forward at the measured speed."""
        tokens = self._speed.units_in(checkpoint, self.chunk_ms)
        if tokens is None:
            return self.first_chunk_tokens
        return int(min(MAX_CHUNK_TOKENS, max(MIN_CHUNK_TOKENS, tokens)))

    def _learn(self, checkpoint: str, resp, chunk: PackedRows) -> None:
        """The forward that ran `chunk` ran `batch_rows` rows in `model_ms`; its tokens are
        estimated from the chunk's (rows of other requests are assumed as long on average)."""
        model_ms, batch_rows = getattr(resp, "model_ms", 0.0), getattr(resp, "batch_rows", 0)
        if model_ms <= 0 or batch_rows <= 0 or chunk.n == 0:
            return
        self._speed.observe(checkpoint, model_ms, float(chunk.lengths.sum()) * max(1.0, batch_rows / chunk.n))

    async def submit(self, checkpoint: str, rows: PackedRows):
        """(response, merged rows, index of this request's first row in them)."""
        if rows.n <= 1 or int(rows.lengths.sum()) <= self.chunk_tokens(checkpoint):
            resp, merged, start = await self._submit(checkpoint, rows)
            if merged is rows:
                self._learn(checkpoint, resp, rows)
            return resp, merged, start
        ends = np.cumsum(rows.lengths)   # tokens up to and including each row
        parts, start = [], 0
        while start < rows.n:   # a cancellation here: the chunks not sent yet never are
            before = int(ends[start - 1]) if start else 0
            end = max(start + 1, int(np.searchsorted(ends, before + self.chunk_tokens(checkpoint), side="right")))
            chunk = rows.take(range(start, end))
            metrics.INFER_CALL_REQUESTS.observe(1)
            resp = await self._call(checkpoint, chunk)
            self._learn(checkpoint, resp, chunk)
            parts.append((resp, chunk, 0, chunk.n))
            start = end
        metrics.INFER_CHUNKS.observe(len(parts))
        return self._join(parts, rows), rows, 0

    async def _submit(self, checkpoint: str, rows: PackedRows):
        lane = self._lanes.setdefault(checkpoint, _Lane())
        if not lane.pending and lane.inflight < self.max_inflight:
            # Nothing to share it with: call from this task (no helper task, no future hand-off).
            lane.inflight += 1
            try:
                metrics.INFER_CALL_REQUESTS.observe(1)
                return await self._call(checkpoint, rows), rows, 0
            finally:
                lane.inflight -= 1
                if lane.pending:
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
